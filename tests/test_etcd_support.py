"""The etcd test harness itself: a cluster whose chosen port another process bound first starts on new
ports instead of timing out (the suite's etcd tests failed that way when clusters ran side by side)."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import pytest

import etcd_support
from etcd_support import EtcdCluster


async def test_a_cluster_whose_port_was_taken_starts_on_new_ports(
        etcd_cluster: Callable[[], Awaitable[EtcdCluster]], monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: etcd cannot bind it, and calls to it are refused
        chosen: list[list[int]] = []
        free_ports = etcd_support._free_ports

        def first_choice_taken(count: int) -> list[int]:
            ports = free_ports(count)
            if not chosen:
                ports[0] = taken.getsockname()[1]  # the first member's client port, as if bound by another
            chosen.append(ports)
            return ports
        monkeypatch.setattr(etcd_support, "_free_ports", first_choice_taken)
        cluster = await etcd_cluster()
    assert len(chosen) == 2 and cluster.client_ports + cluster.peer_ports == chosen[1]
    assert chosen[0][0] not in cluster.client_ports

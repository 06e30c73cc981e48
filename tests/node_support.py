"""Registry nodes in etcd mode as real `agentreach registry` processes (failure_support.child_process), so
a test can kill -9 one or SIGSTOP it; all share one data dir (one secrets.key, as the nodes of a cluster
must) and this test's own key prefix."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from etcd_support import EtcdCluster
from failure_support import ChildProcess, StartChild
from storage_support import AGENTREACH

StartNode = Callable[..., Awaitable[ChildProcess]]


def evictions(node: ChildProcess) -> list[dict[str, Any]]:
    """The "instance evicted" events in the node's log so far."""
    return [event for event in node.running.events("agentreach.registry") if event["event"] == "instance evicted"]


async def cluster_view(http: aiohttp.ClientSession, node: ChildProcess) -> dict[str, Any]:
    async with http.get(f"{node.url}/cluster") as response:
        assert response.status == 200
        return dict(await response.json())


@pytest.fixture
def registry_node(child_process: StartChild, tmp_path: Path) -> StartNode:
    """``await registry_node(cluster, "--node-ttl", "2", ...)``: a running registry node (auth off)."""
    async def start(cluster: EtcdCluster, *flags: str) -> ChildProcess:
        return await child_process([*AGENTREACH, "registry", "--port", "0", "--store", "etcd", "--auth", "off",
                                    "--etcd-endpoints", ",".join(cluster.endpoints),
                                    "--etcd-prefix", f"/{tmp_path.name}/", "--data-dir", str(tmp_path / "nodes"),
                                    *flags], "registry listening")

    return start

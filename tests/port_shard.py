"""Which spare ports this test process may choose. Under pytest-xdist each worker is one shard, (i, n): the
ports p with p % n == i, so two workers never hand one port to two servers. Its children (the Go SDK's tests)
are told theirs in AGENTREACH_PORT_SHARD (conftest.py's pytest_configure)."""

from __future__ import annotations

import os
from collections.abc import Mapping

PORT_SHARD_ENV = "AGENTREACH_PORT_SHARD"


def shard_of(environ: Mapping[str, str]) -> tuple[int, int]:
    """An xdist worker's index and count; else what a parent said in AGENTREACH_PORT_SHARD; else every port."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        return int(worker.removeprefix("gw")), int(environ["PYTEST_XDIST_WORKER_COUNT"])
    index, _, count = environ.get(PORT_SHARD_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        return int(index), int(count)
    return 0, 1  # unset or malformed: every port, as the Go SDK's PortShard reads it


PORT_SHARD = shard_of(os.environ)


def in_shard(port: int) -> bool:
    """Whether ``port`` is this test process's to choose."""
    return port % PORT_SHARD[1] == PORT_SHARD[0]

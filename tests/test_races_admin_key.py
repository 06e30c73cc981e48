"""Two registry nodes started at the same moment on an empty etcd (a real 3-member cluster), each with its own
data dir: exactly one admin key is made. The node whose digest was stored first prints its key and keeps it in
its data dir; the other prints none, writes no admin.key, and says why; the printed key works at both."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
import pytest

from auth.kek import SECRETS_KEY_FILE, load_kek
from conftest import call
from etcd_support import EtcdCluster
from log_support import LogLines
from registry.access import read_admin_key
from registry.server import RegistryServer, RegistrySettings

ROUNDS = 3


async def start_together(cluster: EtcdCluster, prefix: str, data_dirs: list[Path]) -> list[RegistryServer]:
    nodes = [RegistryServer(RegistrySettings(data_dir=data_dir, port=0, auth=True, store="etcd",
                                             etcd_endpoints=cluster.endpoints, etcd_prefix=prefix, etcd_timeout=2.0))
             for data_dir in data_dirs]
    results = await asyncio.gather(*(node.start() for node in nodes), return_exceptions=True)
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        await asyncio.gather(*(node.stop() for node, result in zip(nodes, results, strict=True) if result is None))
        raise failures[0]
    return nodes


async def test_two_nodes_starting_together_make_one_admin_key(etcd_cluster, tmp_path: Path,
                                                              http: aiohttp.ClientSession, router_logs: LogLines):
    cluster = await etcd_cluster()
    for n in range(ROUNDS):
        data_dirs = [tmp_path / f"round{n}" / "a", tmp_path / f"round{n}" / "b"]
        # The operator gave every node the cluster's secrets.key (nodes refuse to run with another), no admin key.
        load_kek(data_dirs[0])
        data_dirs[1].mkdir()
        shutil.copy2(data_dirs[0] / SECRETS_KEY_FILE, data_dirs[1] / SECRETS_KEY_FILE)
        nodes = await start_together(cluster, f"/admin-race-{n}/", data_dirs)
        try:
            printed = [node.new_admin_key for node in nodes]
            [key] = [each for each in printed if each is not None]
            assert [read_admin_key(data_dir) for data_dir in data_dirs] == [each and key for each in printed]
            for node in nodes:
                status, answer = await call(http, "GET", f"{node.url}/clients", key)
                assert status == 200, answer
        finally:
            await asyncio.gather(*(node.stop() for node in nodes))
    lost = [line for line in router_logs.lines if line["event"].startswith("another registry node created")]
    assert len(lost) == ROUNDS and all("admin.key" in line["event"] for line in lost)


async def test_two_nodes_sharing_one_data_dir_keep_the_key_that_won(etcd_cluster, tmp_path: Path,
                                                                    http: aiohttp.ClientSession):
    cluster = await etcd_cluster()
    nodes = await start_together(cluster, "/admin-shared/", [tmp_path / "keys", tmp_path / "keys"])
    try:
        [key] = [node.new_admin_key for node in nodes if node.new_admin_key is not None]
        assert read_admin_key(tmp_path / "keys") == key
        assert (await call(http, "GET", f"{nodes[1].url}/clients", key))[0] == 200
    finally:
        await asyncio.gather(*(node.stop() for node in nodes))


async def test_a_winner_that_cannot_keep_its_key_leaves_none_stored(etcd_cluster, tmp_path: Path,
                                                                    http: aiohttp.ClientSession):
    cluster = await etcd_cluster()
    broken = tmp_path / "broken"
    (broken / "admin.key").mkdir(parents=True)  # the key cannot be written where it belongs
    load_kek(broken)
    fine = tmp_path / "fine"
    fine.mkdir()
    shutil.copy2(broken / SECRETS_KEY_FILE, fine / SECRETS_KEY_FILE)
    with pytest.raises(IsADirectoryError):
        await start_together(cluster, "/admin-broken/", [broken])
    [node] = await start_together(cluster, "/admin-broken/", [fine])
    try:
        assert node.new_admin_key is not None and read_admin_key(fine) == node.new_admin_key
        assert (await call(http, "GET", f"{node.url}/clients", node.new_admin_key))[0] == 200
    finally:
        await node.stop()

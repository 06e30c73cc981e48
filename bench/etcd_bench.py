"""Production-mode (etcd) benchmarks, one command: `python bench/etcd_bench.py [--quick]`.

A real 3-member etcd cluster on loopback (the tests' own `tests/etcd_support.EtcdCluster`, data on the
same disk as the WAL) and registries as real processes (`agentreach registry --store etcd`, auth off),
beside the embedded registry (`agentreach registry`, its WAL), measured side by side in one run:

1. Durable registrations/s: two etcd-mode nodes (the load split across both) against the embedded
   registry under the same client load (two wrk processes, half the connections each), and etcd's
   own ceiling: the same bytes put straight through its JSON gateway. Beside each row, etcd's fsyncs
   (`etcd_disk_wal_fsync_duration_seconds`, `etcd_disk_backend_commit_duration_seconds`, all members),
   its raft proposals per fsync and the CPU each part spent per registration: what bounds the rate.
2. Heartbeats/s per node with 10,000 instances: wrk -c 64 at each etcd-mode node and at the
   embedded registry in alternating rounds (the best round counts), with CPU per heartbeat; and
   registrations/s (2 connections) with those 10,000 present, etcd mode beside the embedded one;
   and what the ownership check's compare costs etcd: one put txn at a time, guarded by a compare
   on its own key or on every instance key, with no instance stored and with 10,000.
3. etcd writes per minute with 10,000 healthy instances heartbeating every 3 s (half to each node,
   each instance on its own timer as an SDK agent, the default 10 s silence timeout) and nothing
   changing: the growth of etcd's
   revision over the window (a range request's header), raft proposals, and lease keep-alives apart
   (`grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}`, summed over members).

Results: tables on stdout, JSON in bench/results/etcd_bench.json with the commit they are for.

The 10,000 instances of measures 2 and 3 are written straight into etcd (records as the registry
builds them) before the nodes start: registering that many through the API in etcd mode takes many
minutes, and measure 2's rows "with 10,000 present" show why.

Subcommand used by the run: `beat --registry URL --prefix P --count N --interval S` heartbeats the
stored instances P-0 .. P-(N-1) every S seconds each, as SDK agents do, until SIGTERM; then prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from agent_reach.registration import RegisterRequest
from prometheus_client.parser import text_string_to_metric_families

from common import RESULTS, ROOT, RegistryProcess, best_rounds, cpu_seconds, machine, require, wrk
from mesh.records import encode_value, instance_key
from registry.records import build_record
from registry_bench import HEARTBEAT_LUA, REGISTER_LUA, filesystem, register_many, registration

# What etcd's /metrics says about one member: (sample name, labels it must carry).
ETCD_COUNTERS = {
    "fsyncs": ("etcd_disk_wal_fsync_duration_seconds_count", {}),
    "fsync_seconds": ("etcd_disk_wal_fsync_duration_seconds_sum", {}),
    "backend_commits": ("etcd_disk_backend_commit_duration_seconds_count", {}),
    "backend_commit_seconds": ("etcd_disk_backend_commit_duration_seconds_sum", {}),
    "proposals": ("etcd_server_proposals_committed_total", {}),
    "is_leader": ("etcd_server_is_leader", {}),
    **{method: ("grpc_server_msg_received_total", {"grpc_method": method})
       for method in ("Txn", "Put", "DeleteRange", "Range", "LeaseKeepAlive", "LeaseGrant")},
}
NODES = 2
# etcd's default --max-txn-ops: the most puts one transaction may carry.
TXN_OPS = 128


# --- reading etcd ------------------------------------------------------------------------------

def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd_cluster(base: Path) -> Any:
    """The tests' 3-member cluster (tests/etcd_support.py), not started: tests and bench run etcd one way."""
    sys.path.insert(0, str(ROOT / "tests"))
    from etcd_support import EtcdCluster

    base.mkdir(parents=True)
    return EtcdCluster(base)


async def etcd_post(session: aiohttp.ClientSession, endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(endpoint + path, json=body) as response:
        response.raise_for_status()
        return await response.json(content_type=None)


async def revision(session: aiohttp.ClientSession, endpoint: str) -> int:
    """etcd's current revision: one write each, whatever the key (a range's header carries it)."""
    ranged = await etcd_post(session, endpoint, "/v3/kv/range", {"key": _b64("/"), "count_only": True})
    return int(ranged["header"]["revision"])


async def member_counters(session: aiohttp.ClientSession, endpoint: str) -> dict[str, float]:
    async with session.get(endpoint + "/metrics") as response:
        text = await response.text()
    found = dict.fromkeys(ETCD_COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for counter, (name, labels) in ETCD_COUNTERS.items():
                if sample.name == name and labels.items() <= sample.labels.items():
                    found[counter] += sample.value
    return found


@dataclasses.dataclass(frozen=True)
class EtcdSnapshot:
    """The cluster's revision, each member's counters and the CPU its processes (and ``pids``) have used."""

    at: float
    revision: int
    members: list[dict[str, float]]
    etcd_cpu: float
    cpu: dict[int, float]

    @classmethod
    async def take(cls, session: aiohttp.ClientSession, cluster: Any, pids: list[int]) -> EtcdSnapshot:
        return cls(at=time.monotonic(), revision=await revision(session, cluster.endpoints[0]),
                   members=[await member_counters(session, endpoint) for endpoint in cluster.endpoints],
                   etcd_cpu=sum(cpu_seconds(process.pid) for process in cluster.processes),
                   cpu={pid: cpu_seconds(pid) for pid in pids})

    def since(self, before: EtcdSnapshot) -> dict[str, Any]:
        """What happened between ``before`` and this snapshot, summed over members where that means something."""
        changed = [{name: after[name] - earlier[name] for name in ETCD_COUNTERS if name != "is_leader"}
                   for earlier, after in zip(before.members, self.members, strict=True)]
        leader = max(range(len(self.members)), key=lambda i: self.members[i]["is_leader"])
        fsyncs = sum(member["fsyncs"] for member in changed)
        commits = sum(member["backend_commits"] for member in changed)
        return {
            "seconds": self.at - before.at,
            "revisions": self.revision - before.revision,
            # Every member counts the same committed index: the leader's growth is the cluster's.
            "proposals": changed[leader]["proposals"],
            "fsyncs_all_members": fsyncs,
            "leader_fsyncs": changed[leader]["fsyncs"],
            "fsync_mean_ms": 1000 * sum(m["fsync_seconds"] for m in changed) / fsyncs if fsyncs else 0.0,
            "backend_commits_all_members": commits,
            "backend_commit_mean_ms": (1000 * sum(m["backend_commit_seconds"] for m in changed) / commits
                                       if commits else 0.0),
            "requests": {method: sum(m[method] for m in changed)
                         for method in ("Txn", "Put", "DeleteRange", "Range", "LeaseKeepAlive", "LeaseGrant")},
            "etcd_cpu_seconds": self.etcd_cpu - before.etcd_cpu,
            "cpu_seconds": {pid: self.cpu[pid] - before.cpu[pid] for pid in self.cpu},
        }


# --- registries --------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def etcd_nodes(work: Path, cluster: Any, prefix: str, *extra: str) -> AsyncIterator[list[RegistryProcess]]:
    """Two etcd-mode registries under ``prefix``, sharing one data dir (the secrets key) as compose's do;
    the first is up before the second starts, so only it writes that key."""
    nodes: list[RegistryProcess] = []
    try:
        for _ in range(NODES):
            nodes.append(RegistryProcess(work / prefix.strip("/"), "--store", "etcd", "--etcd-endpoints",
                                         ",".join(cluster.endpoints), "--etcd-prefix", prefix, *extra))
            await nodes[-1].wait_ready()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@contextlib.asynccontextmanager
async def embedded(work: Path, name: str, *extra: str) -> AsyncIterator[RegistryProcess]:
    registry = RegistryProcess(work / name, *extra)
    try:
        await registry.wait_ready()
        yield registry
    finally:
        registry.stop()


def instance_records(prefix: str, count: int) -> list[tuple[str, bytes]]:
    """Instances prefix-0 .. prefix-(count-1) as the registry stores them (its own build_record)."""
    now = time.time()
    return [(instance_key(f"{prefix}-{n}"),
             encode_value(build_record(msgspec.convert(registration(f"{prefix}-{n}"), RegisterRequest), now)))
            for n in range(count)]


async def seed(session: aiohttp.ClientSession, endpoint: str, etcd_prefix: str,
               records: list[tuple[str, bytes]]) -> None:
    """Write records straight into etcd, TXN_OPS per transaction, before any node starts: through the
    API, 10,000 registrations in etcd mode take many minutes (measure 2's populated rows say why)."""
    for first in range(0, len(records), TXN_OPS):
        puts = [{"request_put": {"key": _b64(etcd_prefix + key), "value": base64.b64encode(value).decode()}}
                for key, value in records[first:first + TXN_OPS]]
        await etcd_post(session, endpoint, "/v3/kv/txn", {"success": puts})


async def compare_cost(session: aiohttp.ClientSession, endpoint: str, prefix: str,
                       rounds: int = 100) -> dict[str, float]:
    """Milliseconds per put txn, one at a time, guarded by a compare on its own key against one on every
    key under ``prefix``instances/ (what an ownership check compares, decision 33)."""
    costs = {}
    for scope in ("one key", "whole prefix"):
        started = time.monotonic()
        for n in range(rounds):
            key = _b64(f"/compare/{scope}/{n}")
            compared = ({"key": _b64(prefix + "instances/"), "range_end": _b64(prefix + "instances0")}
                        if scope == "whole prefix" else {"key": key})
            await etcd_post(session, endpoint, "/v3/kv/txn", {
                "compare": [{**compared, "target": "MOD", "result": "LESS", "mod_revision": 2**62}],
                "success": [{"request_put": {"key": key, "value": _b64("x")}}]})
        costs[scope] = 1000 * (time.monotonic() - started) / rounds
    return costs


def seeded(script: str, seed: int) -> str:
    """REGISTER_LUA draws its agent_ids from math.random, which LuaJIT does not seed: two wrk processes
    would register the same ids. A seed per process keeps every registration a new agent."""
    return f"math.randomseed({seed})\n{script}"


# --- 1. durable registrations ------------------------------------------------------------------

async def registration_row(session: aiohttp.ClientSession, cluster: Any, kind: str, urls: list[str],
                           pids: list[int], scripts: list[str], connections: int, seconds: int) -> dict[str, Any]:
    before = await EtcdSnapshot.take(session, cluster, pids)
    # One wrk process per URL, the connections shared among them, all at once.
    runs = await asyncio.gather(*(asyncio.to_thread(wrk, url, script, connections // len(urls), seconds)
                                  for url, script in zip(urls, scripts, strict=True)))
    etcd = (await EtcdSnapshot.take(session, cluster, pids)).since(before)
    calls = sum(run.calls for run in runs)
    return {"kind": kind, "connections": connections, "rps": sum(run.rps for run in runs),
            "p50_ms": max(run.latency_ms(50) for run in runs), "p99_ms": max(run.latency_ms(99) for run in runs),
            "non_2xx": sum(run.non_2xx for run in runs), "socket_errors": [run.socket_errors for run in runs],
            "registry_cpu_us": 1e6 * sum(etcd["cpu_seconds"].values()) / calls if pids else 0.0,
            "etcd_cpu_us": 1e6 * etcd["etcd_cpu_seconds"] / calls, "calls": calls, "etcd": etcd}


async def instance_value(session: aiohttp.ClientSession, endpoint: str, prefix: str) -> str:
    """One instance record as the registry wrote it (base64): the ceiling puts the same bytes."""
    start = _b64(prefix + "instances/")
    ranged = await etcd_post(session, endpoint, "/v3/kv/range", {"key": start, "range_end": _b64(prefix + "instances0"),
                                                                 "limit": 1})
    return ranged["kvs"][0]["value"]


def put_script(value: str, n: int) -> str:
    body = json.dumps({"key": _b64(f"/ceiling/{n}"), "value": value})
    return ('wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(body)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n')


async def bench_registrations(session: aiohttp.ClientSession, work: Path, cluster: Any,
                              seconds: int) -> list[dict[str, Any]]:
    rows = []
    scripts = [seeded(REGISTER_LUA, seed) for seed in (1, 2)]
    for connections in (2, 8, 64):
        prefix = f"/reg{connections}/"
        async with etcd_nodes(work, cluster, prefix) as nodes:
            rows.append(await registration_row(
                session, cluster, "etcd, 2 nodes", [f"{node.url}/register" for node in nodes],
                [node.process.pid for node in nodes], scripts, connections, seconds))
        async with embedded(work, f"wal{connections}") as registry:
            rows.append(await registration_row(session, cluster, "embedded (WAL)", [f"{registry.url}/register"] * 2,
                                               [registry.process.pid], scripts, connections, seconds))
        value = await instance_value(session, cluster.endpoints[0], prefix)
        rows.append(await registration_row(
            session, cluster, "etcd alone (PUT via gateway)", [f"{cluster.endpoints[0]}/v3/kv/put"] * 2, [],
            [put_script(value, n) for n in (1, 2)], connections, seconds))
        for row in rows[-3:]:
            print(f"  {row['kind']:<30} c={connections:<3} {row['rps']:>8.0f}/s", file=sys.stderr)
    return rows


# --- 2. heartbeats per node --------------------------------------------------------------------

async def bench_heartbeats(session: aiohttp.ClientSession, work: Path, cluster: Any, instances: int, seconds: int,
                           rounds: int) -> dict[str, Any]:
    """Heartbeats per node; and, while the instances are there, registrations with that many present."""
    script = HEARTBEAT_LUA % instances
    registering = [seeded(REGISTER_LUA, seed) for seed in (3, 4)]
    compared = {"empty": await compare_cost(session, cluster.endpoints[0], "/hb/")}
    await seed(session, cluster.endpoints[0], "/hb/", instance_records("hb", instances))
    compared[f"{instances} instances"] = await compare_cost(session, cluster.endpoints[0], "/hb/")
    async with etcd_nodes(work, cluster, "/hb/") as nodes, embedded(work, "hb-wal") as wal:
        targets = {"etcd node 1": nodes[0], "etcd node 2": nodes[1], "embedded (WAL)": wal}
        await register_many(wal.url, instances, "hb")
        populated = [
            await registration_row(session, cluster, "etcd, 2 nodes", [f"{node.url}/register" for node in nodes],
                                   [node.process.pid for node in nodes], registering, 2, seconds),
            await registration_row(session, cluster, "embedded (WAL)", [f"{wal.url}/register"] * 2,
                                   [wal.process.pid], registering, 2, seconds)]
        results: dict[str, list[dict[str, Any]]] = {target: [] for target in targets}
        for _ in range(rounds):
            for target, registry in targets.items():
                run = await asyncio.to_thread(wrk, f"{registry.url}/heartbeat", script, 64, seconds,
                                              registry.process.pid)
                results[target].append({"rps": run.rps, "cpu_us_per_call": run.cpu_seconds / run.calls * 1e6,
                                        "non_2xx": run.non_2xx, "p99_ms": run.latency_ms(99)})
                print(f"  {target:<16} {run.rps:>8.0f} heartbeats/s", file=sys.stderr)
    return {"instances": instances, "txn_ms_by_compare": compared, "registrations_when_populated": populated,
            "targets": best_rounds(results)}


# --- 3. etcd writes while nothing changes ------------------------------------------------------

async def node_counts(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Instances by state and heartbeats accepted, from the registry's /metrics."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "agentreach_registry_instances":
                counts[sample.labels["state"]] = sample.value
            elif sample.name == "agentreach_registry_heartbeats_total":
                counts["heartbeats"] = sample.value
    return counts


async def not_healthy(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """A node's instances that are not healthy, by state and by the beater (so the node) heartbeating them."""
    async with session.get(f"{url}/agents") as response:
        agents = (await response.json())["agents"]
    return dict(collections.Counter(f"{agent['state']} {agent['agent_id'].rsplit('-', 1)[0]}" for agent in agents
                                    if agent["state"] != "healthy"))


async def all_healthy(session: aiohttp.ClientSession, nodes: list[RegistryProcess], instances: int,
                      timeout: float) -> float | None:
    """Seconds until every node counts ``instances`` healthy; None when that never happened in ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        counts = [await node_counts(session, node.url) for node in nodes]
        if all(count.get("healthy") == instances for count in counts):
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    return None


def start_beater(url: str, prefix: str, count: int, interval: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "beat", "--registry", url, "--prefix", prefix, "--count",
                             str(count), "--interval", str(interval)], cwd=ROOT, stdout=subprocess.PIPE, text=True)


async def bench_idle_writes(session: aiohttp.ClientSession, work: Path, cluster: Any, instances: int,
                            interval: float, window: float) -> dict[str, Any]:
    share = instances // NODES
    for n in range(NODES):
        await seed(session, cluster.endpoints[0], "/idle/", instance_records(f"idle{n}", share))
    async with etcd_nodes(work, cluster, "/idle/", "--silence-timeout", "10") as nodes:
        beaters = [start_beater(node.url, f"idle{n}", share, interval) for n, node in enumerate(nodes)]
        try:
            settled = await all_healthy(session, nodes, share * NODES, timeout=max(60.0, 10 * interval))
            # A full interval more, so what the first heartbeats changed is behind us.
            await asyncio.sleep(interval)
            pids = [node.process.pid for node in nodes] + [beater.pid for beater in beaters]
            nodes_before = [await node_counts(session, node.url) for node in nodes]
            before = await EtcdSnapshot.take(session, cluster, pids)
            await asyncio.sleep(window)
            etcd = (await EtcdSnapshot.take(session, cluster, pids)).since(before)
            nodes_after = [await node_counts(session, node.url) for node in nodes]
            unhealthy = [await not_healthy(session, node.url) for node in nodes]
        finally:
            for beater in beaters:
                beater.send_signal(signal.SIGTERM)
            summaries = [json.loads((await asyncio.to_thread(beater.communicate, None, 60))[0])
                         for beater in beaters]
    per_minute = 60 / etcd["seconds"]
    return {"instances": share * NODES, "interval": interval, "window_seconds": etcd["seconds"],
            "seconds_to_all_healthy": settled,
            "writes_per_minute": etcd["revisions"] * per_minute, "proposals_per_minute": etcd["proposals"] * per_minute,
            "keepalives_per_minute": etcd["requests"]["LeaseKeepAlive"] * per_minute,
            "requests_per_minute": {k: v * per_minute for k, v in etcd["requests"].items()},
            "heartbeats_per_second": [(after["heartbeats"] - before_["heartbeats"]) / etcd["seconds"]
                                      for before_, after in zip(nodes_before, nodes_after, strict=True)],
            "states_at_start": nodes_before, "states_at_end": nodes_after, "not_healthy_at_end": unhealthy,
            "beaters": summaries, "etcd": etcd}


class KeepAlive:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP to POST JSON and read the status:
    a fraction of aiohttp's client cost per request, so one process can play 5,000 agents."""

    def __init__(self, host: str, port: int):
        self._address = (host, port)
        self._host = f"{host}:{port}".encode()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes) -> int:
        if self._streams is None:
            self._streams = await asyncio.open_connection(*self._address)
        reader, writer = self._streams
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), self._host, len(body), body))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1)))
        except (OSError, asyncio.IncompleteReadError):
            self._streams = None
            writer.close()
            raise
        return int(head[9:12])


async def beat(url: str, prefix: str, count: int, interval: float) -> dict[str, Any]:
    """Heartbeat instances prefix-0 .. prefix-(count-1) (already stored) every ``interval`` s each, their
    first beats spread over the first interval, as SDK agents do (registering again on 404), until SIGTERM."""
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    statuses: collections.Counter[str] = collections.Counter()
    latest = 0.0  # the most a heartbeat left after it was due (this process behind, or the registry slow)
    where = urllib.parse.urlsplit(url)
    pool: asyncio.Queue[KeepAlive] = asyncio.Queue()
    for _ in range(64):
        pool.put_nowait(KeepAlive(where.hostname, where.port))

    async def post(path: str, body: dict[str, Any]) -> int:
        connection = await pool.get()
        try:
            status = await connection.post(path, json.dumps(body).encode())
        except (OSError, asyncio.IncompleteReadError) as exc:
            status = 0
            statuses[type(exc).__name__] += 1
        finally:
            pool.put_nowait(connection)
        statuses[f"{path} {status}"] += 1
        return status

    async def agent(n: int) -> None:
        nonlocal latest
        agent_id = f"{prefix}-{n}"
        due = start + n * interval / count
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            latest = max(latest, time.monotonic() - due)
            if await post("/heartbeat", {"agent_id": agent_id, "load": 0.3}) == 404:
                await post("/register", registration(agent_id))
            due += interval

    start = time.monotonic()
    agents = [asyncio.create_task(agent(n)) for n in range(count)]
    await stopping.wait()
    for task in agents:
        task.cancel()
    await asyncio.gather(*agents, return_exceptions=True)
    return {"statuses": dict(statuses), "most_late_seconds": latest}


# --- the run -----------------------------------------------------------------------------------

def tree() -> dict[str, Any]:
    """The commit the figures are for, and any uncommitted change to the code they measure."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "registry", "mesh", "wal", "agentreach", "weblayer",
                               "auth", "sdk").splitlines()}


def print_registrations(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title:<32}{'conns':>6}{'regs/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'non2xx':>7}{'reg CPU us':>11}"
          f"{'etcd CPU us':>12}{'txns/reg':>9}{'revs/s':>8}{'props/fsync':>12}{'fsync ms':>9}{'commit ms':>10}")
    for row in rows:
        etcd = row["etcd"]
        per_fsync = etcd["proposals"] / etcd["leader_fsyncs"] if etcd["leader_fsyncs"] else 0.0
        print(f"{row['kind']:<32}{row['connections']:>6}{row['rps']:>9.0f}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}"
              f"{row['non_2xx']:>7}{row['registry_cpu_us']:>11.0f}{row['etcd_cpu_us']:>12.0f}"
              f"{etcd['requests']['Txn'] / row['calls']:>9.1f}{etcd['revisions'] / etcd['seconds']:>8.0f}"
              f"{per_fsync:>12.1f}{etcd['fsync_mean_ms']:>9.2f}{etcd['backend_commit_mean_ms']:>10.2f}")
        for errors in filter(None, row["socket_errors"]):  # a wrk timeout (2 s) leaves p99 short of the truth
            print(f"    wrk: {errors}")


def print_results(results: dict[str, Any]) -> None:
    print(json.dumps(results["machine"]))
    print(json.dumps(results["tree"]))
    print_registrations("1. durable registrations", results["registrations"])
    hb = results["heartbeats"]
    wal = hb["targets"]["embedded (WAL)"]
    print(f"\n2. heartbeats with {hb['instances']} instances (wrk -c 64, best round)")
    for target, best in hb["targets"].items():
        print(f"{target:<18}{best['rps']:>9.0f}/s {best['cpu_us_per_call']:>6.0f} us CPU/heartbeat  "
              f"{best['rps'] / wal['rps']:.2f}x the embedded registry (target >= 0.8x)")
    print_registrations(f"with {hb['instances']} present", hb["registrations_when_populated"])
    print(f"one put txn at a time, ms, by what it compares: {json.dumps(hb['txn_ms_by_compare'])}")
    idle = results["idle"]
    print(f"\n3. {idle['instances']} healthy instances heartbeating every {idle['interval']:.0f} s, "
          f"{idle['window_seconds']:.0f} s window (all healthy after {idle['seconds_to_all_healthy']} s)")
    print(f"etcd writes (revision growth): {idle['writes_per_minute']:.0f}/min = "
          f"{idle['writes_per_minute'] / 60 / NODES:.2f} per node per second (target <= 1)")
    print(f"raft proposals {idle['proposals_per_minute']:.0f}/min; "
          f"lease keep-alives {idle['keepalives_per_minute']:.0f}/min; "
          f"requests/min {json.dumps({k: round(v) for k, v in idle['requests_per_minute'].items()})}")
    print(f"heartbeats accepted per node per second: {[round(rate) for rate in idle['heartbeats_per_second']]}; "
          f"states at start {idle['states_at_start']}, at end {idle['states_at_end']}")
    print(f"not healthy at the end, per node (idle0 heartbeats to node 1, idle1 to node 2): "
          f"{idle['not_healthy_at_end']}")
    print(f"beaters: {idle['beaters']}")
    print(f"load average at start and end: {results['load_average']}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="etcd-bench-", dir=RESULTS))
    cluster = etcd_cluster(work / "etcd")
    try:
        for member in range(len(cluster.names)):
            cluster.start(member)
        async with aiohttp.ClientSession() as session:
            await cluster.healthy(session)
            load_at_start = os.getloadavg()[0]
            results = {"machine": machine(filesystem=filesystem(RESULTS), etcd=etcd_version()), "tree": tree(),
                       "registrations": await bench_registrations(session, work, cluster, args.seconds),
                       "heartbeats": await bench_heartbeats(session, work, cluster, args.instances, args.seconds,
                                                            args.rounds),
                       "idle": await bench_idle_writes(session, work, cluster, args.instances, args.interval,
                                                       args.window)}
            # Others' work on the same cores slows every figure: how busy the machine was.
            return {**results, "load_average": [load_at_start, os.getloadavg()[0]]}
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def etcd_version() -> str:
    return subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command")
    beating = commands.add_parser("beat", help="heartbeat stored instances until SIGTERM")
    beating.add_argument("--registry", required=True)
    beating.add_argument("--prefix", required=True)
    beating.add_argument("--count", type=int, required=True)
    beating.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="short runs (3 s, one heartbeat round, 15 s window)")
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=3.0, help="heartbeat interval in measure 3")
    parser.add_argument("--json", type=Path, default=RESULTS / "etcd_bench.json")
    args = parser.parse_args()
    if args.command == "beat":
        print(json.dumps(asyncio.run(beat(args.registry, args.prefix, args.count, args.interval))))
        return
    require("wrk", "df", "etcd")
    args.seconds, args.rounds, args.window = (3, 1, 15.0) if args.quick else (10, 3, 60.0)
    results = asyncio.run(run(args))
    print_results(results)
    args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

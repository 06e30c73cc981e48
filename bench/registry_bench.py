"""Registry benchmarks, one command: `python bench/registry_bench.py [--json out.json]`.

1. Durable registrations/s end to end (POST /register) with 1 and 64 concurrent connections,
   group commit vs one fsync per record, side by side in one run (load from wrk, its own process).
2. Heartbeats/s and latency percentiles with 10,000 registered instances (wrk, 64 connections).
3. Memory per registered instance (registry RSS growth over 10,000 registrations).
4. Restart time of a registry whose WAL holds 1,000,000 records (no snapshot: full replay).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

from common import RESULTS, RegistryProcess, machine, require, wrk

REGISTER_LUA = """
local counter = 0
function setup(thread) thread:set("tid", math.random(1, 1000000000)) end
request = function()
  counter = counter + 1
  local body = string.format('{"agent_id":"b-%d-%d","service":"bench","capabilities":[{"name":"bench.cap",'
    .. '"protocol":"rest","endpoint":"http://127.0.0.1:9/x","timeout_sla_ms":5000}],'
    .. '"metadata":{"zone":"z","model":"m","max_qps":100,"semver":"1.0.0"}}', tid, counter)
  return wrk.format("POST", "/register", {["Content-Type"] = "application/json"}, body)
end
"""

HEARTBEAT_LUA = """
local n = %d
request = function()
  local body = string.format('{"agent_id":"hb-%%d","load":0.3,"inflight":2}', math.random(0, n - 1))
  return wrk.format("POST", "/heartbeat", {["Content-Type"] = "application/json"}, body)
end
"""


def filesystem(path: Path) -> str:
    """The file system type under ``path`` (the registry's WAL and data live there)."""
    return subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]


def wrk_latency(url: str, script: str, connections: int, seconds: int) -> dict[str, float]:
    run = wrk(url, script, connections, seconds)
    return {"rps": run.rps, **{f"p{p}": run.latency_ms(p) for p in (50, 90, 99)}, "errors": run.non_2xx}


def registration(agent_id: str) -> dict:
    """The body registering one heartbeating instance (service hb, capability hb.cap)."""
    return {"agent_id": agent_id, "service": "hb",
            "capabilities": [{"name": "hb.cap", "protocol": "rest", "endpoint": "http://127.0.0.1:9/x"}],
            "metadata": {"zone": "z", "model": "m", "max_qps": 100, "semver": "1.0.0"}}


async def register_many(url: str, count: int, prefix: str) -> None:
    queue = iter(range(count))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in queue:
            async with session.post(f"{url}/register", json=registration(f"{prefix}-{i}")) as response:
                assert response.status == 200, await response.text()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(64)))


async def bench_registrations(work: Path, seconds: int) -> list[dict]:
    rows = []
    for mode, extra in (("group commit", ()), ("fsync per record", ("--no-group-commit",))):
        for connections in (1, 64):
            data_dir = work / f"reg-{mode.replace(' ', '-')}-{connections}"
            registry = RegistryProcess(data_dir, *extra)
            await registry.wait_ready()
            result = wrk_latency(registry.url, REGISTER_LUA, connections, seconds)
            registry.stop()
            rows.append({"mode": mode, "connections": connections, **result})
            shutil.rmtree(data_dir)
    return rows


async def bench_heartbeats(work: Path, instances: int, seconds: int) -> dict:
    registry = RegistryProcess(work / "hb")
    await registry.wait_ready()
    rss_before = registry.rss_bytes()
    await register_many(registry.url, instances, "hb")
    rss_after = registry.rss_bytes()
    result = wrk_latency(registry.url, HEARTBEAT_LUA % instances, 64, seconds)
    registry.stop()
    return {"instances": instances, **result, "bytes_per_instance": (rss_after - rss_before) / instances}


def build_log(data_dir: Path, records: int, distinct: int) -> None:
    """Write `records` registration changes for `distinct` agents straight through the WAL API."""
    from agent_reach.registration import Capability

    from mesh.records import InstanceRecord, encode_value, instance_key
    from registry.store import Change, encode_change
    from wal import WriteAheadLog

    async def write() -> None:
        wal = WriteAheadLog(data_dir / "wal")
        wal.open(lambda i, d: None, lambda i, d: None)
        payloads = []
        for n in range(records):
            agent_id = f"replay-{n % distinct}"
            record = InstanceRecord(
                agent_id=agent_id, service="replay", health_url="http://127.0.0.1:9/healthz",
                capabilities=[Capability(name="replay.cap", endpoint="http://127.0.0.1:9/x", protocol="rest")],
                metadata={"zone": "z", "model": "m", "max_qps": 100, "semver": "1.0.0"}, registered_at=time.time())
            payloads.append(encode_change(Change(instance_key(agent_id), encode_value(record))))
            if len(payloads) == 4096:
                await asyncio.gather(*(wal.append(p) for p in payloads))
                payloads.clear()
        await asyncio.gather(*(wal.append(p) for p in payloads))
        await wal.close()

    asyncio.run(write())


async def bench_replay(work: Path, records: int) -> dict:
    data_dir = work / "replay"
    await asyncio.to_thread(build_log, data_dir, records, 10_000)
    registry = RegistryProcess(data_dir)
    seconds = await registry.wait_ready()
    registry.stop()
    return {"records": records, "distinct_instances": 10_000, "restart_seconds": seconds}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per run")
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--replay-records", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, default=RESULTS / "registry_bench.json")
    args = parser.parse_args()
    require("wrk", "df")
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="registry-bench-", dir=RESULTS))
    try:
        results = {"machine": machine(filesystem=filesystem(RESULTS)),
                   "registrations": await bench_registrations(work, args.seconds),
                   "heartbeats": await bench_heartbeats(work, args.instances, args.seconds * 2),
                   "replay": await bench_replay(work, args.replay_records)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results["machine"]))
    print(f"\n{'durable registrations (POST /register)':<44}{'conns':>6}{'regs/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for row in results["registrations"]:
        print(f"{row['mode']:<44}{row['connections']:>6}{row['rps']:>10.0f}{row['p50']:>9.2f}{row['p99']:>9.2f}")
    by = {(r["mode"], r["connections"]): r["rps"] for r in results["registrations"]}
    print(f"group commit / fsync per record at 64 connections: "
          f"{by[('group commit', 64)] / by[('fsync per record', 64)]:.1f}x (target >= 5x)")
    hb = results["heartbeats"]
    print(f"\nheartbeats with {hb['instances']} instances, 64 conns: {hb['rps']:.0f}/s, p50 {hb['p50']:.2f} ms, "
          f"p90 {hb['p90']:.2f} ms, p99 {hb['p99']:.2f} ms, non-2xx {hb['errors']} "
          f"(target >= 5000/s, p99 <= 20 ms)")
    print(f"memory per registered instance: {hb['bytes_per_instance']:.0f} bytes (target <= 4096)")
    rp = results["replay"]
    print(f"restart with {rp['records']} WAL records ({rp['distinct_instances']} instances): "
          f"{rp['restart_seconds']:.2f} s until /healthz answers (target <= 10 s)")
    args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

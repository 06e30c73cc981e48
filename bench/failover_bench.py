"""How long a registry node's death is felt, one command: `python bench/failover_bench.py [--rounds N]`.

Each round: a fresh key prefix on a real 3-member etcd (the tests' `tests/etcd_support.EtcdCluster`),
two registry nodes as processes (defaults: `--node-ttl 5`), the first leading; a router process
following both; an SDK agent (default heartbeat interval, 3 s) heartbeating to the first. Then kill -9
the first node and time, from the kill:
- the agent: until its next heartbeat is acknowledged by the other node;
- the router: until it logs that it follows the other node's watch feed;
- the leader: until the other node's `/cluster` says it leads (bounded by the lease TTL + one poll).
Results: a table on stdout, JSON in bench/results/failover_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from agent_reach import AgentReachSDK

from common import RESULTS, ROOT, RegistryProcess, free_port, machine, require, wait_http

sys.path.insert(0, str(ROOT / "tests"))
from etcd_support import EtcdCluster


class RouterProcess:
    """`agentreach router` following several registries; its log read as it comes (times are the log's own)."""

    def __init__(self, registries: str, data_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentreach.cli", "router", "--port", str(self.port), "--registry", registries,
             "--auth", "off", "--no-audit", "--data-dir", str(data_dir)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def followed(self, registry: str, after: float) -> float | None:
        """The wall-clock moment it logged following ``registry`` after ``after`` (a wall-clock moment)."""
        moments = (datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp() for event in list(self.lines)
                   if event["event"] == "following registry" and event.get("registry") == registry)
        return next((at for at in moments if at > after), None)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


async def until(condition: Any, timeout: float, what: str) -> float:
    """Monotonic time when ``condition()`` first held (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic()
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{what}: not within {timeout}s")


async def cluster_view(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/cluster") as response:
        return dict(await response.json())


async def one_round(cluster: EtcdCluster, base: Path, n: int, http: aiohttp.ClientSession) -> dict[str, float]:
    etcd = ["--store", "etcd", "--etcd-endpoints", ",".join(cluster.endpoints), "--etcd-prefix", f"/round{n}/",
            "--log-level", "info"]
    first = RegistryProcess(base / "keys", *etcd)
    await first.wait_ready()
    await until(lambda: cluster_view(http, first.url), 10, "the first node up")
    second = RegistryProcess(base / "keys", *etcd)
    await second.wait_ready()
    router = RouterProcess(f"{first.url},{second.url}", base / f"router{n}")
    agent = AgentReachSDK(agent_id=f"bench-{n}", registry_url=[first.url, second.url], zone="bench")

    @agent.capability("bench.echo")
    async def echo(payload: Any, ctx: Any) -> Any:
        return payload

    try:
        await wait_http(f"{router.url}/healthz", 30)
        await agent.start()
        link = agent.link
        assert link is not None
        await until(lambda: link.beats >= 1, 15, "the agent heartbeats")
        view = await cluster_view(http, second.url)
        assert view["leader"] != view["node_id"], "the first node should lead"
        beats = link.beats
        killed, killed_wall = time.monotonic(), time.time()
        first.process.kill()
        first.process.wait()
        agent_moved = await until(lambda: link.beats > beats and link.registries.current == second.url, 30,
                                  "the agent heartbeats to the other node")

        async def leads() -> bool:
            view = await cluster_view(http, second.url)
            return bool(view["leader"] == view["node_id"])
        led = await until(leads, 30, "the other node leads")
        await until(lambda: router.followed(second.url, killed_wall), 30, "the router follows the other node")
        router_moved = router.followed(second.url, killed_wall)
        assert router_moved is not None
        return {"agent_s": agent_moved - killed, "router_s": router_moved - killed_wall, "leader_s": led - killed}
    finally:
        await agent.stop()
        router.stop()
        second.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require("etcd")
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        base = Path(tmp)
        cluster = EtcdCluster(base / "etcd")
        (base / "etcd").mkdir()
        for i in range(len(cluster.names)):
            cluster.start(i)
        try:
            async with aiohttp.ClientSession() as http:
                await cluster.healthy(http)
                rounds = [await one_round(cluster, base, n, http) for n in range(args.rounds)]
        finally:
            cluster.stop()
    summary = {key: {"median": round(statistics.median(r[key] for r in rounds), 3),
                     "max": round(max(r[key] for r in rounds), 3)} for key in rounds[0]}
    print(f"{'moved after kill -9 of a node':34} {'median s':>9} {'max s':>7}")
    for key, label in (("agent_s", "agent (heartbeat interval 3 s)"), ("router_s", "router's watch feed"),
                       ("leader_s", "new leader (node TTL 5 s)")):
        print(f"{label:34} {summary[key]['median']:9.2f} {summary[key]['max']:7.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "failover_bench.json").write_text(json.dumps({"machine": machine(), "rounds": rounds,
                                                             "summary": summary}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

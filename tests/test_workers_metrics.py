"""`agentreach router --workers 2` seen as one router: /metrics, /reach and /traces on the shared port answer for
every worker, whichever worker the kernel hands the scrape to. Real processes on loopback, a real registry and
agent, scrapes over real HTTP on fresh connections (so they land on either worker)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_for
from registry.server import RegistryServer
from router.merged import Family, Sample, merge_metrics, merge_reach
from router.metrics import SUMMED_GAUGES
from router.reach import ReachLedger, ReachView, latency_quantile
from sdk_support import free_port
from test_workers import Caller, Supervised, register_echo, until_forwarding

SCRAPES = 8


async def fresh_get(url: str, **params: str) -> aiohttp.ClientResponse:
    """A GET on a connection of its own, body read: the kernel may hand it to either worker."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
            session.get(url, params=params) as response:
        await response.read()
        return response


async def scraped(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await fresh_get(f"{url}/metrics")
    assert response.status == 200, await response.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(await response.text()) for sample in family.samples}


def calls(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str = "success") -> float:
    return metrics.get(("agentreach_router_calls_total", (("capability", "echo"), ("outcome", outcome))), 0.0)


async def reach_total(url: str) -> int:
    response = await fresh_get(f"{url}/reach", capability="echo")
    assert response.status == 200, await response.text()
    return sum(period["total"] for period in (await response.json())["periods"])


async def own_calls(private_dir: Path, index: int) -> float:
    """Worker ``index``'s own count, from its private socket (what the shared port adds up)."""
    connector = aiohttp.UnixConnector(path=str(private_dir / f"worker-{index}.sock"))
    async with aiohttp.ClientSession(connector=connector) as session, session.get("http://worker/metrics") as response:
        own = msgspec.msgpack.decode(await response.read(), type=list[Family])
    return sum(sample.value for family in own for sample in family.samples
               if sample.name == "agentreach_router_calls_total" and sample.labels == {"capability": "echo",
                                                                                      "outcome": "success"})


async def test_every_scrape_of_the_shared_port_counts_every_workers_calls(
        registry: RegistryServer, start_agent: Callable[..., Any], tmp_path: Path) -> None:
    agent = await start_agent("echo-1")
    await register_echo(registry.url, agent)
    port = free_port()
    router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", registry.url,
                                    "--auth", "off", "--data-dir", str(tmp_path))
    try:
        ready = await router.wait_logged("workers ready")
        pids, private_dir = ready["pids"], Path(ready["private_dir"])
        assert {path.name: path.stat().st_mode & 0o777 for path in private_dir.iterdir()} == {
            "worker-0.sock": 0o600, "worker-1.sock": 0o600}
        assert private_dir.stat().st_mode & 0o777 == 0o700
        url = f"http://127.0.0.1:{port}"
        caller = Caller(url, "")
        await until_forwarding(caller, pids, agent.port, router)  # each worker has served calls
        await caller.calls("counted", 30)
        assert caller.failures == []
        served = len(caller.answered)

        metrics = await scraped(url)
        for _ in range(SCRAPES):
            assert calls(metrics) == served
            assert metrics[("agentreach_router_call_seconds_count", (("capability", "echo"),))] == served
            assert metrics[("agentreach_router_workers_merged", ())] == 2
            # A gauge that is one worker's state is shown for each worker.
            assert {labels for name, labels in metrics if name == "agentreach_router_limit_share"} == {
                (("worker", "0"),), (("worker", "1"),)}
            assert await reach_total(url) == served
            metrics = await scraped(url)
        shares = [await own_calls(private_dir, index) for index in (0, 1)]
        assert all(shares) and sum(shares) == served

        listed: list[list[str]] = []
        for _ in range(SCRAPES):
            response = await fresh_get(f"{url}/traces", limit="1000")
            traces = (await response.json())["traces"]
            assert [call["started_at"] for call in traces] == sorted((call["started_at"] for call in traces),
                                                                     reverse=True)
            listed.append([call["request_id"] for call in traces])
        assert all(ids == listed[0] for ids in listed)
        sampled_out = metrics[("agentreach_router_traces_sampled_out_total", ())]
        assert set(listed[0]) <= set(caller.answered) and len(listed[0]) + sampled_out == served
        for request_id in listed[0][:SCRAPES]:  # each found, whichever worker kept it and whichever answers
            response = await fresh_get(f"{url}/traces/{request_id}")
            assert response.status == 200 and (await response.json())["call"]["request_id"] == request_id
        assert (await fresh_get(f"{url}/traces/never-made")).status == 404

        # A worker killed outright takes its counts with it: every scrape then shows the survivor's alone
        # (Prometheus reads the fall as a counter reset), and the restarted worker starts from zero.
        survivor = await own_calls(private_dir, 1)
        os.kill(pids[0], signal.SIGKILL)
        await router.wait_logged("worker restarted", worker=0)
        for _ in range(SCRAPES):
            metrics = await scraped(url)
            assert calls(metrics) == survivor < served
            assert metrics[("agentreach_router_workers_merged", ())] == 2
            assert await reach_total(url) == survivor
        assert await own_calls(private_dir, 0) == 0

        router.process.send_signal(signal.SIGTERM)
        assert await router.exit_code() == 0
        assert not private_dir.exists()
    finally:
        await router.close()


async def test_a_worker_that_does_not_answer_fails_the_scrape_rather_than_undercount(
        registry: RegistryServer, tmp_path: Path) -> None:
    """A live worker left out would make every counter fall, then rise again: two counter resets to Prometheus."""
    port = free_port()
    router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", registry.url,
                                    "--auth", "off", "--data-dir", str(tmp_path))
    try:
        ready = await router.wait_logged("workers ready")
        pids, private_dir = ready["pids"], Path(ready["private_dir"])
        os.kill(pids[1], signal.SIGSTOP)  # alive, holding its socket, answering nothing
        try:
            # Scrapes the kernel hands to the stopped worker wait in its queue; the others are answered.
            scrapes = [asyncio.create_task(fresh_get(f"http://127.0.0.1:{port}/metrics")) for _ in range(2 * SCRAPES)]
            await wait_for(lambda: any(scrape.done() for scrape in scrapes), timeout=30,
                           what="the running worker to answer")
        finally:
            os.kill(pids[1], signal.SIGCONT)
        answers = await asyncio.gather(*scrapes)
        assert any(answer.status == 503 for answer in answers)
        for answer in answers:  # the ones the stopped worker answered once it ran again: both workers counted
            assert answer.status == 503 or "agentreach_router_workers_merged 2.0" in await answer.text()

        router.process.kill()  # the parent, outright: the workers stop by themselves, and leave no sockets behind
        await wait_for(lambda: not private_dir.exists(), timeout=60, what="the workers to remove their directory")
    finally:
        await router.close()


def test_merging_sums_counters_and_histograms_and_keeps_each_workers_own_gauges() -> None:
    def family(name: str, kind: str, *samples: tuple[str, dict[str, str], float]) -> Family:
        return Family(name, kind, "", [Sample(*sample) for sample in samples])

    worker_0 = [family("calls", "counter", ("calls_total", {"capability": "a"}, 3.0)),
                family("seconds", "histogram", ("seconds_bucket", {"capability": "a", "le": "+Inf"}, 3.0)),
                family("agentreach_router_inflight", "gauge", ("agentreach_router_inflight", {"instance": "i"}, 1.0)),
                family("share", "gauge", ("share", {}, 0.25))]
    worker_1 = [family("calls", "counter", ("calls_total", {"capability": "a"}, 2.0),
                       ("calls_total", {"capability": "b"}, 1.0)),
                family("seconds", "histogram", ("seconds_bucket", {"capability": "a", "le": "+Inf"}, 2.0)),
                family("agentreach_router_inflight", "gauge", ("agentreach_router_inflight", {"instance": "i"}, 2.0)),
                family("share", "gauge", ("share", {}, 0.25))]
    merged = {metric.name: [(sample.name, sample.labels, sample.value) for sample in metric.samples]
              for metric in merge_metrics({0: worker_0, 1: worker_1}, SUMMED_GAUGES)}
    assert merged == {
        "calls": [("calls_total", {"capability": "a"}, 5.0), ("calls_total", {"capability": "b"}, 1.0)],
        "seconds": [("seconds_bucket", {"capability": "a", "le": "+Inf"}, 5.0)],
        "agentreach_router_inflight": [("agentreach_router_inflight", {"instance": "i"}, 3.0)],
        "share": [("share", {"worker": "0"}, 0.25), ("share", {"worker": "1"}, 0.25)]}


def test_merged_reach_periods_add_up_and_take_percentiles_from_the_summed_buckets() -> None:
    fast, slow = ReachLedger(), ReachLedger()
    for _ in range(3):
        fast.record("echo", "success", None, 4.0, now=120.0)
    slow.record("echo", "failed", "TIMEOUT", 900.0, now=121.0)
    slow.record("other", "degraded", None, 40.0, now=121.0)
    views = [ReachView(period_seconds=60.0, periods=ledger.periods(now=130.0), instance_health_rate=1.0,
                       route_decisions={"policy": calls}) for ledger, calls in ((fast, 3), (slow, 2))]
    whole = merge_reach(views[0], views[1:])
    assert [(period.capability, period.total, period.failed) for period in whole.periods] == [("echo", 4, 1),
                                                                                            ("other", 1, 0)]
    echo = whole.periods[0]
    assert echo.reach_rate == 0.75 and echo.failed_by_code == {"TIMEOUT": 1}
    assert echo.latency_p99_ms is not None and echo.latency_p99_ms > 500
    assert echo.latency_p99_ms == latency_quantile(echo.latency_buckets, 0.99)
    assert whole.route_decisions == {"policy": 5}

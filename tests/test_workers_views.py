"""`agentreach router --workers 2` seen as one router beyond its metrics: /usage, /rules/stats and /scores on the
shared port answer for every worker, whichever worker the kernel hands the request to. Real processes on loopback,
a real registry and agent, each request on a fresh connection (so it lands on either worker)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from agent_reach.usage import Usage

from registry.server import RegistryServer
from router.merged import merge_usage
from router.usage import OTHER, UsageLedger
from sdk_support import free_port
from test_workers import Caller, Supervised, register_echo, until_forwarding
from test_workers_metrics import SCRAPES, fresh_get

PRICE = 0.25


class Served:
    """A `--workers 2` router in front of a priced echo agent, and the calls it answered."""

    def __init__(self, url: str, caller: Caller):
        self.url = url
        self.caller = caller

    async def every_scrape(self, path: str, **params: str) -> Any:
        """``path``'s answer, the same on ``SCRAPES`` fresh connections (else the assertion says how it differs)."""
        answers = []
        for _ in range(SCRAPES):
            response = await fresh_get(f"{self.url}{path}", **params)
            assert response.status == 200, await response.text()
            answers.append(await response.json())
        assert all(answer == answers[0] for answer in answers), answers
        return answers[0]


@pytest.fixture
async def served(registry: RegistryServer, start_agent: Callable[..., Any], tmp_path: Path) -> AsyncIterator[Served]:
    agent = await start_agent("echo-1")
    await register_echo(registry.url, agent, cost_per_call=PRICE)
    port = free_port()
    router = await Supervised.start("router", "--workers", "2", "--port", str(port), "--registry", registry.url,
                                    "--auth", "off", "--data-dir", str(tmp_path))
    try:
        ready = await router.wait_logged("workers ready")
        caller = Caller(f"http://127.0.0.1:{port}", "")
        await until_forwarding(caller, ready["pids"], agent.port, router)  # each worker has served calls
        await caller.calls("counted", 20)
        assert caller.failures == []
        yield Served(caller.url, caller)
    finally:
        await router.close()


async def test_usage_on_the_shared_port_adds_up_every_workers_ledger(served: Served) -> None:
    calls = len(served.caller.answered)
    for period in ("hour", "day"):
        answer = await served.every_scrape("/usage", period=period, capability="echo")
        [whole] = answer["periods"]
        assert (whole["total"]["calls"], whole["total"]["cost"]) == (calls, calls * PRICE)
        assert whole["by_capability"]["echo"]["calls"] == whole["by_instance"]["echo-1"]["calls"] == calls
    assert (await served.every_scrape("/usage", capability="never-called"))["periods"] == []
    refused = await fresh_get(f"{served.url}/usage", period="week")
    assert refused.status == 400 and (await refused.json())["field"] == "period"


def test_merged_usage_keeps_each_workers_overflow_in_one_other_row() -> None:
    ledgers = [UsageLedger(max_keys=1), UsageLedger(max_keys=1)]
    for worker, ledger in enumerate(ledgers):
        ledger.record("a", "echo", "echo-1", Usage(input_tokens=1, cost=0.5), now=7200.0)
        ledger.record(f"late-{worker}", "echo", "echo-1", Usage(output_tokens=2, cost=0.25), now=7201.0)
    ledgers[1].record("a", "echo", "echo-1", Usage(), now=3600.0)
    [earlier, hour] = merge_usage({worker: ledger.periods("hour") for worker, ledger in enumerate(ledgers)})
    assert (earlier.start, earlier.total.calls, hour.start) == (3600, 1, 7200)
    assert {name: (used.calls, used.input_tokens, used.output_tokens, used.cost)
            for name, used in hour.by_client.items()} == {"a": (2, 2, 0, 1.0), OTHER: (2, 0, 4, 0.5)}
    assert hour.by_capability.keys() == {"echo", OTHER} and hour.total.calls == 4

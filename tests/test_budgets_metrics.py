"""Budgets on /metrics: the router's refusals by reason, its lease asks by outcome and their latency, what it
holds leased but unspent; the registry's accounts and those with nothing left. A real registry, a real
router following it over HTTP, a real agent reporting 10 tokens a call, both scraped over HTTP."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from router.core import RouterSettings
from test_budgets_routers import TOKENS_PER_CALL, budgeted, metered, routers, spend  # noqa: F401 (a fixture)


async def scraped(http: Any, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``url``/metrics by (name, sorted labels)."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def labelled(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (sample, labels), value in samples.items() if sample == name}


async def test_budget_refusals_lease_asks_and_unspent_leases_are_on_both_metrics(
        start_mesh, metered, http):  # noqa: F811 (the fixture imported)
    # No periodic report: every ask the router makes is one a call needed.
    [mesh] = await routers(start_mesh, metered, count=1, routing=RouterSettings(budget_report_seconds=3600))
    roomy = await budgeted([mesh], budget_tokens=1000, budget_period="day")
    tight = await budgeted([mesh], budget_tokens=30, budget_period="day")
    assert [(await spend(mesh, roomy)).status for _ in range(3)] == [200] * 3  # a 50-token chunk, 30 spent
    assert [(await spend(mesh, tight)).status for _ in range(4)] == [200, 200, 200, 429]
    session = {"session_id": "s-1", "token_budget": 15}  # room for one call of 10 tokens
    assert [(await spend(mesh, roomy, context=session)).status for _ in range(2)] == [200, 429]

    registry = await scraped(http, mesh.registry.url)
    assert registry[("agentreach_registry_budget_accounts", ())] == 2
    assert registry[("agentreach_registry_budget_accounts_exhausted", ())] == 1
    router = await scraped(http, mesh.url)
    # 50 - 40 tokens of the roomy client's lease; the tight one spent all it was granted.
    assert router[("agentreach_router_budget_leased_unspent_tokens", ())] == 50 - 4 * TOKENS_PER_CALL
    assert router[("agentreach_router_budget_leased_unspent_cost", ())] == 0

    await mesh.registry.stop()
    # 10 tokens left of the lease: one more call, then the registry cannot be asked.
    assert [(await spend(mesh, roomy)).status for _ in range(3)] == [200, 429, 429]
    router = await scraped(http, mesh.url)
    refusals = labelled(router, "agentreach_router_budget_refusals_total", "reason")
    assert refusals == {"budget_exhausted": 1, "budget_unconfirmed": 2, "session_budget_exhausted": 1}
    asks = labelled(router, "agentreach_router_budget_lease_asks_total", "outcome")
    assert asks["granted"] >= 2 and asks["failed"] == 1 and set(asks) <= {"granted", "dry", "empty", "reported",
                                                                          "released", "failed"}
    assert router[("agentreach_router_budget_lease_ask_seconds_count", ())] == sum(asks.values())
    assert router[("agentreach_router_budget_lease_ask_seconds_bucket", (("le", "+Inf"),))] == sum(asks.values())
    assert router[("agentreach_router_budget_leased_unspent_tokens", ())] == 0

"""The reservation a budgeted client's call declaring no bound makes recovers after one huge call: it is the
largest usage among the client's last ESTIMATE_WINDOW calls that reported usage, not the largest ever (which
reserved a huge call's size for every later call: a lease with room for hundreds of the usual calls would
refuse one once little was left).
A router's budgets spending from a real registry's account in process (test_budgets_period.py)."""

from __future__ import annotations

from agent_reach.usage import Usage

from router.budgets import ESTIMATE_WINDOW, Budgets, Ticket
from test_budgets_period import registry, spender  # noqa: F401 (a fixture)

HUGE = Usage(input_tokens=1500, output_tokens=500)
SMALL = Usage(input_tokens=4, output_tokens=6)


async def one_call(budgets: Budgets, client_id: str, usage: Usage) -> None:
    admitted = await budgets.admit(client_id, {})
    assert isinstance(admitted, Ticket), admitted
    budgets.settle(admitted, usage)


async def test_after_one_huge_call_and_a_window_of_small_ones_a_call_reserves_the_small_size_again(
        registry):  # noqa: F811 (the fixture imported)
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=10_000, budget_period="day")
    await one_call(budgets, client_id, HUGE)
    for _ in range(ESTIMATE_WINDOW - 1):
        await one_call(budgets, client_id, SMALL)
    # The huge call is still among the last ESTIMATE_WINDOW: the next call reserves its 2,000 tokens.
    admitted = await budgets.admit(client_id, {})
    assert isinstance(admitted, Ticket) and admitted.tokens == 2000
    budgets.settle(admitted, SMALL)
    # Now the window holds small calls only: a call reserves 10 tokens.
    admitted = await budgets.admit(client_id, {})
    assert isinstance(admitted, Ticket) and admitted.tokens == 10


async def test_calls_that_report_no_usage_do_not_shrink_the_estimate(registry):  # noqa: F811
    registry, clock = registry
    client_id, budgets = await spender(registry, clock, budget_tokens=10_000, budget_period="day")
    await one_call(budgets, client_id, HUGE)
    for _ in range(ESTIMATE_WINDOW):
        admitted = await budgets.admit(client_id, {})
        assert isinstance(admitted, Ticket)
        budgets.settle(admitted, None)  # an error, or an agent that reports nothing: its size is unknown
    assert (await budgets.admit(client_id, {})).tokens == 2000

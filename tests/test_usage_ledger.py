"""The usage ledger's bounds: old buckets go, rows past the cap are summed under OTHER, totals stay exact."""

from __future__ import annotations

from agent_reach.usage import Usage

from router.usage import DAYS_KEPT, HOURS_KEPT, OTHER, Totals, UsageLedger

USED = Usage(input_tokens=10, output_tokens=20, cost=0.5)


def test_an_hour_and_a_day_bucket_each_count_the_call_and_filters_pick_rows():
    ledger = UsageLedger()
    ledger.record("c1", "llm", "a1", USED, 3600 * 5 + 10)
    ledger.record("c2", "llm", "a2", Usage(input_tokens=1), 3600 * 5 + 20)
    ledger.record("c1", "other", "a3", Usage(output_tokens=4), 3600 * 6)
    hours = ledger.periods("hour")
    assert [(p.start, p.total.calls) for p in hours] == [(3600 * 5, 2), (3600 * 6, 1)]
    assert hours[0].by_client == {"c1": Totals(calls=1, input_tokens=10, output_tokens=20, cost=0.5),
                                  "c2": Totals(calls=1, input_tokens=1)}
    assert [p.total for p in ledger.periods("day", client="c1")] == [
        Totals(calls=2, input_tokens=10, output_tokens=24, cost=0.5)]
    assert [p.by_instance for p in ledger.periods("day", capability="other")] == [{"a3": Totals(calls=1,
                                                                                               output_tokens=4)}]
    assert ledger.periods("day", client="nobody") == []
    assert ledger.lifetime() == {"llm": Totals(calls=2, input_tokens=11, output_tokens=20, cost=0.5),
                                 "other": Totals(calls=1, output_tokens=4)}


def test_only_the_latest_buckets_are_kept():
    ledger = UsageLedger()
    for hour in range(HOURS_KEPT + 5):
        ledger.record("c", "llm", "a", USED, hour * 3600.0)
    assert [p.start for p in ledger.periods("hour")] == [hour * 3600 for hour in range(5, HOURS_KEPT + 5)]
    for day in range(DAYS_KEPT + 2):
        ledger.record("c", "llm", "a", USED, day * 86_400.0)
    assert len(ledger.periods("day")) == DAYS_KEPT


def test_rows_past_the_cap_are_summed_under_other_and_totals_stay_exact():
    ledger = UsageLedger(max_keys=3)
    for client in range(10):
        ledger.record(f"c{client}", "llm", "a", USED, 100.0)
    ledger.record("c0", "llm", "a", USED, 100.0)  # a known row still counts under its own name
    (hour,) = ledger.periods("hour")
    assert hour.total == Totals(calls=11, input_tokens=110, output_tokens=220, cost=5.5)
    assert {name: used.calls for name, used in hour.by_client.items()} == {"c0": 2, "c1": 1, "c2": 1, OTHER: 7}

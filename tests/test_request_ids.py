"""Request and trace ids: 32 hex digits, unpredictable, and in time order across milliseconds (so the audit
trail's indexes on them grow at their end; decision 61)."""

from __future__ import annotations

import re
import time

from agent_reach.atp import new_request_id
from agent_reach.context import new_trace_id


def next_millisecond() -> None:
    """Until the clock's millisecond changes (a condition, not a pause of a guessed length)."""
    now = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 == now:
        pass


def test_ids_are_32_hex_digits_never_all_zero_and_never_repeat() -> None:
    made = [new_request_id() for _ in range(2000)] + [new_trace_id() for _ in range(2000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", made_id) and made_id != "0" * 32 for made_id in made)
    assert len(set(made)) == len(made)
    assert len({made_id[12:] for made_id in made}) == len(made)  # 80 random bits apart from the time


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    made = []
    for _ in range(5):
        made.append(new_request_id())
        next_millisecond()
    assert made == sorted(made)  # before: random, so five in order by chance once in 120 runs
    assert int(made[-1][:12], 16) - int(made[0][:12], 16) >= 4
    assert abs(int(new_trace_id()[:12], 16) - time.time_ns() // 1_000_000) < 1000

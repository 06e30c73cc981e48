"""Circuit breakers: a sliding error window, open, half-open probes, close or reopen."""

from mesh.policy import BreakerConfig
from router.breaker import BreakerSnapshot, BreakerState, CircuitBreaker, SlidingWindow

CONFIG = BreakerConfig(error_threshold_percent=50, min_requests=10, reset_seconds=30, window_seconds=60)


def record_many(breaker: CircuitBreaker, successes: int, failures: int, now: float) -> None:
    for _ in range(successes):
        breaker.record(True, now)
    for _ in range(failures):
        breaker.record(False, now)


def opened(at: float, config: BreakerConfig = CONFIG) -> CircuitBreaker:
    breaker = CircuitBreaker(config)
    record_many(breaker, 0, config.min_requests, at)
    assert breaker.state(at) is BreakerState.OPEN
    return breaker


def test_stays_closed_below_min_requests_even_if_everything_fails():
    breaker = CircuitBreaker(CONFIG)
    record_many(breaker, 0, 9, now=5.0)
    assert breaker.state(5.0) is BreakerState.CLOSED and breaker.allow(5.0)


def test_opens_on_the_request_that_reaches_the_threshold():
    breaker = CircuitBreaker(CONFIG)
    record_many(breaker, 5, 4, now=1.0)
    assert breaker.state(1.0) is BreakerState.CLOSED
    breaker.record(False, 2.0)
    assert breaker.snapshot(2.0) == BreakerSnapshot(state=BreakerState.OPEN, requests=10, failures=5, opened_at=2.0)
    assert not breaker.allow(2.0)


def test_error_rate_below_threshold_keeps_it_closed():
    breaker = CircuitBreaker(CONFIG)
    record_many(breaker, 6, 4, now=1.0)
    record_many(breaker, 60, 40, now=2.0)
    assert breaker.state(2.0) is BreakerState.CLOSED


def test_old_errors_age_out_of_the_window():
    breaker = CircuitBreaker(CONFIG)
    record_many(breaker, 0, 9, now=0.5)
    assert breaker.snapshot(59.9).requests == 9
    assert breaker.snapshot(60.0).requests == 0
    record_many(breaker, 9, 1, now=60.0)
    assert breaker.snapshot(60.0) == BreakerSnapshot(state=BreakerState.CLOSED, requests=10, failures=1,
                                                     opened_at=None)


def test_window_slides_bucket_by_bucket():
    window = SlidingWindow(3)
    window.add(False, 10.2)
    window.add(True, 11.7)
    window.add(False, 12.1)
    assert window.counts(12.9) == (3, 2)
    assert window.counts(13.0) == (2, 1)
    assert window.counts(14.5) == (1, 1)
    assert window.counts(15.0) == (0, 0)


def test_a_slightly_older_clock_counts_in_the_newest_bucket():
    window = SlidingWindow(2)
    window.add(True, 20.1)
    window.add(False, 19.9)
    assert window.counts(21.5) == (2, 1)
    assert window.counts(22.0) == (0, 0)


def test_open_refuses_until_reset_then_half_open_lets_one_probe_through():
    breaker = opened(at=100.0)
    assert not breaker.allow(129.9)
    assert breaker.state(130.0) is BreakerState.HALF_OPEN
    assert breaker.allow(130.0)
    assert not breaker.allow(130.1)


def test_successful_probe_closes_and_clears_the_window():
    breaker = opened(at=100.0)
    assert breaker.allow(131.0)
    breaker.record(True, 131.5)
    assert breaker.snapshot(131.5) == BreakerSnapshot(state=BreakerState.CLOSED, requests=0, failures=0,
                                                      opened_at=None)
    record_many(breaker, 0, 9, now=132.0)
    assert breaker.state(132.0) is BreakerState.CLOSED


def test_failed_probe_reopens_for_another_reset_period():
    breaker = opened(at=100.0)
    assert breaker.allow(131.0)
    breaker.record(False, 132.0)
    assert breaker.snapshot(132.0).state is BreakerState.OPEN
    assert breaker.snapshot(132.0).opened_at == 132.0
    assert not breaker.allow(161.9)
    assert breaker.allow(162.0)


def test_half_open_admits_the_configured_number_of_probes():
    config = BreakerConfig(error_threshold_percent=50, min_requests=4, reset_seconds=10, half_open_probes=3)
    breaker = opened(at=0.0, config=config)
    assert [breaker.allow(10.0) for _ in range(4)] == [True, True, True, False]


def test_a_lost_probe_frees_its_place_after_reset_seconds():
    breaker = opened(at=0.0)
    assert breaker.allow(30.0)
    assert not breaker.allow(59.9)
    assert breaker.allow(60.0)
    assert breaker.state(60.0) is BreakerState.HALF_OPEN


def test_late_answers_while_open_or_without_a_probe_change_nothing():
    breaker = opened(at=100.0)
    breaker.record(True, 110.0)
    assert breaker.snapshot(110.0).state is BreakerState.OPEN
    breaker.record(True, 135.0)
    breaker.record(False, 135.0)
    assert breaker.snapshot(135.0) == BreakerSnapshot(state=BreakerState.HALF_OPEN, requests=10, failures=10,
                                                      opened_at=100.0)


def test_state_is_a_plain_string_for_json():
    assert CircuitBreaker(CONFIG).state(0.0) == "closed"
    assert opened(at=0.0).state(0.0) == "open"
    assert opened(at=0.0).state(30.0) == "half_open"

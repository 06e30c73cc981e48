"""The lifecycle decisions as pure functions: no sockets, no sleeps, the clock passed in."""

from registry.lifecycle import (
    LifecycleConfig,
    Liveness,
    Status,
    plan_evictions,
    record_check,
    record_heartbeat,
    status_of,
)

CONFIG = LifecycleConfig(silence_timeout=10, evict_after=3, guard_silent_fraction=0.5, guard_min_instances=4,
                         evict_cap_fraction=0.1)


def test_pending_until_first_heartbeat_then_healthy_then_demoted():
    liveness = Liveness(registered=100.0)
    assert status_of(liveness, False, 105.0, CONFIG) is Status.PENDING
    record_heartbeat(liveness, 106.0)
    assert status_of(liveness, False, 115.9, CONFIG) is Status.HEALTHY
    assert status_of(liveness, False, 116.1, CONFIG) is Status.DEMOTED


def test_never_heard_from_is_demoted_after_the_silence_timeout():
    assert status_of(Liveness(registered=0.0), False, 10.5, CONFIG) is Status.DEMOTED


def test_evicted_wins_over_everything():
    liveness = Liveness(registered=0.0)
    record_heartbeat(liveness, 1.0)
    assert status_of(liveness, True, 1.0, CONFIG) is Status.EVICTED


def test_passing_check_restores_and_resets_failures():
    liveness = Liveness(registered=0.0)
    record_check(liveness, False, 20.0)
    record_check(liveness, False, 23.0)
    assert liveness.failed_checks == 2
    record_check(liveness, True, 26.0)
    assert liveness.failed_checks == 0
    assert status_of(liveness, False, 27.0, CONFIG) is Status.HEALTHY


def test_heartbeat_resets_failed_checks():
    liveness = Liveness(registered=0.0, failed_checks=2)
    record_heartbeat(liveness, 30.0)
    assert liveness.failed_checks == 0 and liveness.last_heartbeat == 30.0


def test_eviction_capped_per_sweep():
    plan = plan_evictions([f"a{i}" for i in range(5)], live=40, silent=5, config=CONFIG)
    assert plan.evict == ["a0", "a1", "a2", "a3"] and plan.deferred == 1 and not plan.guard_active


def test_at_least_one_eviction_per_sweep_in_small_pools():
    plan = plan_evictions(["a0"], live=3, silent=1, config=CONFIG)
    assert plan.evict == ["a0"]


def test_guard_pauses_evictions_when_most_are_silent():
    plan = plan_evictions(["a0", "a1", "a2"], live=5, silent=3, config=CONFIG)
    assert plan.guard_active and plan.evict == [] and plan.deferred == 3


def test_guard_needs_a_minimum_pool():
    plan = plan_evictions(["a0", "a1"], live=3, silent=3, config=CONFIG)
    assert not plan.guard_active and plan.evict == ["a0"]

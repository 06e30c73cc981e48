"""Choosing the instances for one call, the max_qps bucket and the sticky table that feed it."""

import math
import random
from collections import Counter

from agent_reach.atp import ErrorCode

from router.hashring import HashRing
from router.ratelimit import TokenBucket
from router.selection import (
    Candidate,
    RoutePlan,
    RouteRefusal,
    _ring_of,
    choose_policy,
    plan_route,
    session_hash_key,
)
from router.sticky import StickyTable, sticky_key


def candidate(agent_id: str, state: str = "healthy", load: float = 0.0, inflight: int = 0, **fields) -> Candidate:
    return Candidate(agent_id=agent_id, endpoint=f"http://127.0.0.1:9/{agent_id}", protocol="rest", state=state,
                     load=load, inflight=inflight, **fields)


def plan(candidates: list[Candidate], policy: str = "least_load", *, hash_key: str = "session-1",
         hint: dict | None = None, sticky: str | None = None, seed: int = 7, **knobs) -> RoutePlan | RouteRefusal:
    return plan_route(candidates, policy_name=policy, hash_key=hash_key, routing_hint=hint, sticky_agent=sticky,
                      rng=random.Random(seed), **knobs)


def ids(result: RoutePlan | RouteRefusal) -> list[str]:
    assert isinstance(result, RoutePlan), result
    return [chosen.agent_id for chosen in result.order]


def refusal_code(result: RoutePlan | RouteRefusal) -> ErrorCode:
    assert isinstance(result, RouteRefusal), result
    return result.code


# --- filters ------------------------------------------------------------------------------------

def test_no_instances_is_no_routable_instance():
    assert refusal_code(plan([])) is ErrorCode.NO_ROUTABLE_INSTANCE
    assert refusal_code(plan([], hint={"env": "staging"})) is ErrorCode.NO_ROUTABLE_INSTANCE


def test_unsatisfiable_hint_is_refused_never_sent_elsewhere():
    pool = [candidate("prod-1", metadata={"env": "prod"}), candidate("bare")]
    for policy in ("least_load", "hash", "affinity"):
        result = plan(pool, policy, hint={"env": "staging"})
        assert refusal_code(result) is ErrorCode.ROUTING_HINT_UNSATISFIABLE
        assert "env='staging'" in result.reason


def test_hint_keeps_only_instances_matching_every_label():
    pool = [candidate("a", metadata={"env": "staging", "zone": "eu"}),
            candidate("b", metadata={"env": "staging", "zone": "us"}),
            candidate("c", metadata={"env": "prod", "zone": "eu"}),
            candidate("d", metadata={"env": "staging"})]
    assert ids(plan(pool, hint={"env": "staging", "zone": "eu"})) == ["a"]
    assert sorted(ids(plan(pool, hint={"env": "staging"}))) == ["a", "b", "d"]
    assert sorted(ids(plan(pool, hint={}))) == ["a", "b", "c", "d"]


def test_hint_values_compare_exactly():
    pool = [candidate("a", metadata={"tier": 1})]
    assert refusal_code(plan(pool, hint={"tier": "1"})) is ErrorCode.ROUTING_HINT_UNSATISFIABLE
    assert ids(plan(pool, hint={"tier": 1})) == ["a"]


def test_demoted_and_pending_wait_while_a_healthy_instance_is_left():
    pool = [candidate("demoted", "demoted"), candidate("pending", "pending"), candidate("healthy", load=0.9)]
    result = plan(pool)
    assert ids(result) == ["healthy"] and not result.degraded


def test_only_demoted_or_pending_left_is_a_degraded_plan():
    result = plan([candidate("demoted", "demoted", load=0.1), candidate("pending", "pending", load=0.5)])
    assert ids(result) == ["demoted", "pending"] and result.degraded and not result.panic


def test_tiers_are_chosen_after_the_hint():
    pool = [candidate("prod", metadata={"env": "prod"}), candidate("staging", "demoted", metadata={"env": "staging"})]
    result = plan(pool, hint={"env": "staging"})
    assert ids(result) == ["staging"] and result.degraded


def test_unknown_states_are_never_routed():
    assert refusal_code(plan([candidate("gone", "evicted")])) is ErrorCode.NO_ROUTABLE_INSTANCE


def test_unavailable_instances_are_skipped_while_enough_remain():
    pool = [candidate("a"), candidate("b", available=False), candidate("c", load=0.5), candidate("d", available=False)]
    result = plan(pool)
    assert ids(result) == ["a", "c"] and not result.panic


def test_panic_routes_to_the_whole_tier_when_too_few_are_available():
    pool = [candidate("a", load=0.3, available=False), candidate("b", load=0.1, available=False),
            candidate("c", load=0.2)]
    result = plan(pool)
    assert ids(result) == ["b", "c", "a"] and result.panic and not result.degraded


def test_breakers_never_empty_a_pool():
    result = plan([candidate("a", available=False)])
    assert ids(result) == ["a"] and result.panic


def test_panic_threshold_is_configurable():
    pool = [candidate("a"), candidate("b", available=False), candidate("c", available=False)]
    assert plan(pool, panic_threshold=0.5).panic
    assert ids(plan(pool, panic_threshold=0.3)) == ["a"]


def test_instances_without_capacity_are_skipped():
    pool = [candidate("a", has_capacity=False), candidate("b", load=0.9)]
    assert ids(plan(pool)) == ["b"]


def test_every_instance_at_capacity_is_busy():
    pool = [candidate("a", has_capacity=False), candidate("b", has_capacity=False),
            candidate("c", available=False)]
    assert refusal_code(plan(pool, panic_threshold=0.1)) is ErrorCode.BUSY


def test_capacity_still_counts_in_panic():
    pool = [candidate("a", available=False, has_capacity=False), candidate("b", available=False)]
    result = plan(pool)
    assert ids(result) == ["b"] and result.panic


# --- policies -----------------------------------------------------------------------------------

def test_least_load_orders_by_inflight_plus_load():
    pool = [candidate("a", load=0.9, inflight=1), candidate("b", load=0.2, inflight=2), candidate("c", load=0.5),
            candidate("d", load=0.0, inflight=1)]
    result = plan(pool)
    assert ids(result) == ["c", "d", "a", "b"] and result.policy == "least_load"


def test_least_load_spreads_ties_between_idle_instances():
    pool = [candidate("a"), candidate("b"), candidate("c", load=0.5)]
    rng = random.Random(3)
    firsts = Counter(ids(plan_route(pool, policy_name="least_load", hash_key="k", routing_hint=None,
                                    sticky_agent=None, rng=rng))[0] for _ in range(200))
    assert set(firsts) == {"a", "b"}
    assert min(firsts.values()) > 60


def test_large_pools_pick_the_better_of_two_random_instances_first():
    pool = [candidate(f"agent-{rank}", load=rank / 100) for rank in range(12)]
    rng = random.Random(11)
    firsts = Counter()
    for _ in range(2000):
        order = ids(plan_route(pool, policy_name="least_load", hash_key="k", routing_hint=None, sticky_agent=None,
                               rng=rng))
        firsts[order[0]] += 1
        assert sorted(order) == sorted(chosen.agent_id for chosen in pool)
        assert order[1:] == sorted(order[1:], key=lambda agent_id: int(agent_id.split("-")[1]))
    assert "agent-11" not in firsts
    assert len(firsts) == 11
    # The best is one of the two picks with probability 1 - C(11,2)/C(12,2) = 1/6.
    assert 250 < firsts["agent-0"] < 420


def test_small_pools_always_start_with_the_least_loaded():
    pool = [candidate(f"agent-{rank}", load=rank / 100) for rank in range(8)]
    assert {ids(plan(pool, seed=seed))[0] for seed in range(50)} == {"agent-0"}


def test_hash_follows_the_ring_over_all_instances():
    pool = [candidate(f"agent-{number}") for number in range(6)]
    ring = HashRing(chosen.agent_id for chosen in pool)
    for key in ("session-1", "session-2", "session-3"):
        result = plan(pool, "hash", hash_key=key)
        assert ids(result) == ring.preference(key) and result.policy == "hash"


def test_hash_keeps_a_session_on_its_instance_whatever_the_load():
    pool = [candidate(f"agent-{number}") for number in range(6)]
    first = ids(plan(pool, "hash", hash_key="session-9"))[0]
    loaded = [candidate(chosen.agent_id, load=0.9 if chosen.agent_id == first else 0.0) for chosen in pool]
    assert ids(plan(loaded, "hash", hash_key="session-9", seed=99))[0] == first


def test_hash_fails_over_in_ring_order_when_the_owner_is_ineligible():
    pool = [candidate(f"agent-{number}") for number in range(6)]
    preference = HashRing(chosen.agent_id for chosen in pool).preference("session-4")
    pool = [candidate(chosen.agent_id, has_capacity=chosen.agent_id != preference[0]) for chosen in pool]
    assert ids(plan(pool, "hash", hash_key="session-4")) == preference[1:]


def test_hash_reuses_the_ring_while_membership_is_unchanged():
    pool = [candidate(f"member-{number}") for number in range(5)]
    plan(pool, "hash", hash_key="one")
    before = _ring_of.cache_info()
    plan([candidate(chosen.agent_id, load=0.5) for chosen in reversed(pool)], "hash", hash_key="two")
    after = _ring_of.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)


def test_affinity_is_least_load_among_the_matching_instances():
    pool = [candidate("eu-busy", load=0.8, metadata={"zone": "eu"}), candidate("eu-idle", load=0.1,
                                                                               metadata={"zone": "eu"}),
            candidate("us-idle", metadata={"zone": "us"})]
    result = plan(pool, "affinity", hint={"zone": "eu"})
    assert ids(result) == ["eu-idle", "eu-busy"] and result.policy == "affinity"


def test_sticky_instance_goes_first_when_eligible():
    pool = [candidate("a"), candidate("b", load=0.5), candidate("c", load=0.7)]
    assert ids(plan(pool, sticky="c")) == ["c", "a", "b"]
    assert ids(plan(pool, "hash", sticky="b"))[0] == "b"


def test_sticky_instance_that_is_not_eligible_is_ignored():
    pool = [candidate("a"), candidate("b", load=0.5, has_capacity=False), candidate("c", "demoted")]
    assert ids(plan(pool, sticky="b")) == ["a"]
    assert ids(plan(pool, sticky="c")) == ["a"]
    assert ids(plan(pool, sticky="gone")) == ["a"]


def test_choose_policy_prefers_capability_then_instances_then_default():
    assert choose_policy("hash", ["affinity", "affinity"], "least_load") == "hash"
    assert choose_policy(None, ["affinity", None, "hash", "affinity"], "least_load") == "affinity"
    assert choose_policy(None, ["hash", "affinity"], "least_load") == "affinity"
    assert choose_policy(None, [None, None], "least_load") == "least_load"
    assert choose_policy(None, [], "hash") == "hash"


def test_hash_key_is_the_session_or_else_the_request():
    assert session_hash_key({"session_id": "s-1"}, "req-1") == "s-1"
    assert session_hash_key({"session_id": 42}, "req-1") == "42"
    assert session_hash_key({"session_id": ""}, "req-1") == "req-1"
    assert session_hash_key({}, "req-1") == "req-1"


# --- max_qps token bucket -----------------------------------------------------------------------

def test_bucket_allows_a_burst_then_refills_at_the_rate():
    bucket = TokenBucket(rate=2, burst=3)
    assert [bucket.try_take(10.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.available(10.25) == 0.5
    assert not bucket.try_take(10.25)
    assert bucket.try_take(10.5)
    assert bucket.available(100.0) == 3


def test_bucket_burst_defaults_to_the_rate_and_at_least_one():
    assert TokenBucket(rate=5).burst == 5
    slow = TokenBucket(rate=0.5)
    assert slow.burst == 1
    assert [slow.try_take(0.0), slow.try_take(1.0), slow.try_take(2.0)] == [True, False, True]


def test_bucket_with_no_rate_is_unlimited():
    bucket = TokenBucket(rate=0)
    assert all(bucket.try_take(1.0) for _ in range(1000))
    assert bucket.available(1.0) == math.inf


def test_bucket_ignores_a_clock_that_goes_back():
    bucket = TokenBucket(rate=1, burst=1)
    assert bucket.try_take(5.0)
    assert not bucket.try_take(4.0)
    assert bucket.available(5.5) == 0.5


# --- sticky table -------------------------------------------------------------------------------

def test_sticky_entry_lives_for_its_ttl():
    table = StickyTable()
    table.put("cap\x00s1", "agent-a", ttl=300, now=1000.0)
    assert table.get("cap\x00s1", 1299.9) == "agent-a"
    assert table.get("cap\x00s1", 1300.0) is None
    assert len(table) == 0


def test_sticky_put_refreshes_and_replaces():
    table = StickyTable()
    table.put("k", "agent-a", ttl=10, now=0.0)
    table.put("k", "agent-b", ttl=10, now=8.0)
    assert table.get("k", 17.0) == "agent-b"


def test_sticky_table_drops_the_oldest_when_full():
    table = StickyTable(max_entries=2)
    table.put("one", "a", ttl=60, now=0.0)
    table.put("two", "b", ttl=60, now=1.0)
    table.put("one", "a", ttl=60, now=2.0)
    table.put("three", "c", ttl=60, now=3.0)
    assert [table.get(key, 4.0) for key in ("one", "two", "three")] == ["a", None, "c"]


def test_sticky_table_reclaims_expired_entries_on_write():
    table = StickyTable()
    table.put("short", "a", ttl=1, now=0.0)
    table.put("long", "b", ttl=100, now=0.5)
    table.put("new", "c", ttl=100, now=2.0)
    assert len(table) == 2


def test_sticky_key_is_per_capability_and_needs_the_field():
    assert sticky_key("intent.detect", {"session_id": "s1"}, "session_id") == "intent.detect\x00s1"
    assert sticky_key("other", {"session_id": "s1"}, "session_id") != sticky_key("intent.detect",
                                                                                    {"session_id": "s1"}, "session_id")
    assert sticky_key("intent.detect", {"user_id": "u"}, "session_id") is None
    assert sticky_key("intent.detect", {"session_id": ""}, "session_id") is None

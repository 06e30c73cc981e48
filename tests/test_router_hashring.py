"""Consistent hashing: sessions keep their node, membership changes move only about 1/N of keys."""

from collections import Counter

from router.hashring import HashRing, stable_hash

KEYS = [f"session-{number}" for number in range(10_000)]


def nodes(count: int) -> list[str]:
    return [f"agent-{number}" for number in range(count)]


def owners(ring: HashRing) -> dict[str, str | None]:
    return {key: ring.lookup(key) for key in KEYS}


def test_empty_ring_has_no_owner_and_no_preference():
    ring = HashRing([])
    assert ring.lookup("session-1") is None
    assert ring.preference("session-1") == []
    assert ring.nodes == frozenset()


def test_hash_is_pinned_so_every_router_process_agrees():
    assert stable_hash("session-1") == 0xAE49BD2CD463E7AC
    assert stable_hash("session-2") != stable_hash("session-1")


def test_a_session_keeps_its_node_whatever_order_the_ring_is_built_in():
    first = HashRing(nodes(5))
    second = HashRing(reversed(nodes(5)))
    assert owners(first) == owners(second)
    assert first.nodes == frozenset(nodes(5))


def test_preference_lists_every_node_once_owner_first():
    ring = HashRing(nodes(7))
    for key in KEYS[:200]:
        order = ring.preference(key)
        assert order[0] == ring.lookup(key)
        assert sorted(order) == sorted(nodes(7))


def test_preference_of_a_subset_is_the_full_preference_without_the_others():
    full = HashRing(nodes(8))
    subset = HashRing(nodes(8)[2:6])
    for key in KEYS[:200]:
        assert subset.preference(key) == [node for node in full.preference(key) if node in subset.nodes]


def test_adding_one_of_n_nodes_moves_only_the_keys_it_takes():
    before = owners(HashRing(nodes(10)))
    after = owners(HashRing(nodes(11)))
    moved = [key for key in KEYS if before[key] != after[key]]
    assert 0 < len(moved) < 1.6 * len(KEYS) / 11
    assert {after[key] for key in moved} == {"agent-10"}
    assert [key for key in KEYS if after[key] == "agent-10"] == moved


def test_removing_one_of_n_nodes_moves_only_the_keys_it_held():
    before = owners(HashRing(nodes(10)))
    after = owners(HashRing([node for node in nodes(10) if node != "agent-3"]))
    moved = [key for key in KEYS if before[key] != after[key]]
    assert 0 < len(moved) < 1.6 * len(KEYS) / 10
    assert moved == [key for key in KEYS if before[key] == "agent-3"]


def test_keys_spread_roughly_evenly():
    shares = Counter(owners(HashRing(nodes(10))).values())
    assert set(shares) == set(nodes(10))
    assert all(0.75 * 1000 <= count <= 1.25 * 1000 for count in shares.values()), shares

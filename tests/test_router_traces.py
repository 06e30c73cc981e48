"""The trace store: recent calls by request_id, assembled into call trees by trace_id."""

from router.traces import MAX_TREE_DEPTH, AttemptTrace, CallTrace, TraceStore

FORWARDED = [AttemptTrace(instance="i-1", endpoint="http://127.0.0.1:9/call", protocol="rest", started_ms=0.0,
                          elapsed_ms=1.0)]


def call(request_id, parent=None, trace="t1", capability="cap.a", caller=None, at=0.0, forwarded=False):
    return CallTrace(request_id=request_id, capability=capability, trace_id=trace, started_at=at,
                     parent_request_id=parent, caller=caller, attempts=FORWARDED if forwarded else [])


def shape(node):
    return (node.call.request_id, [shape(child) for child in node.children])


def test_tree_is_rooted_at_the_oldest_ancestor_from_any_member():
    store = TraceStore()
    for c in (call("root"), call("a", "root"), call("b", "root"), call("a1", "a"), call("other", trace="t2")):
        store.add(c)
    expected = ("root", [("a", [("a1", [])]), ("b", [])])
    assert shape(store.tree("a1")) == expected
    assert shape(store.tree("root")) == expected
    assert shape(store.tree("other")) == ("other", [])
    assert store.tree("missing") is None


def test_oldest_calls_are_forgotten_first():
    store = TraceStore(max_calls=3)
    for name in ("c1", "c2", "c3", "c4"):
        store.add(call(name, trace=name))
    assert store.get("c1") is None and store.get("c4") is not None
    assert [c.request_id for c in store.recent(10)] == ["c4", "c3", "c2"]


def test_recent_filters_by_capability_and_limit():
    store = TraceStore()
    for i in range(5):
        store.add(call(f"r{i}", trace=f"t{i}", capability="cap.a" if i % 2 else "cap.b"))
    assert [c.request_id for c in store.recent(10, capability="cap.a")] == ["r3", "r1"]
    assert [c.request_id for c in store.recent(2)] == ["r4", "r3"]


def test_a_cycle_of_parents_does_not_hang():
    store = TraceStore()
    store.add(call("x", "y"))
    store.add(call("y", "x"))
    tree = store.tree("x")
    assert tree.call.request_id in {"x", "y"}
    assert len(tree.children) == 1 and tree.children[0].children == []


def test_under_load_plain_successes_are_sampled_and_everything_else_is_kept():
    store = TraceStore(successes_per_second=2)
    second = 1_800_000_000.0
    assert [store.wants(True, second + 0.1 * n) for n in range(4)] == [True, True, False, False]
    assert store.wants(False, second + 0.5), "a failed, degraded or refused call is always traced"
    assert store.sampled_out == 2
    assert store.wants(True, second + 1.0), "a new second, a new budget"
    unlimited = TraceStore(successes_per_second=0)
    assert all(unlimited.wants(True, second) for _ in range(10_000)) and unlimited.sampled_out == 0


def test_calls_sharing_a_request_id_are_all_kept_and_the_newest_answers():
    store = TraceStore(max_calls=3)
    for caller in ("a", "b"):
        store.add(call("dup", caller=caller))
    assert store.get("dup").caller == "b"
    assert [c.caller for c in store.recent(10)] == ["b", "a"]
    store.add(call("x", trace="t2"))
    store.add(call("y", trace="t3"))
    assert store.get("dup").caller == "b" and len(store.recent(10)) == 3
    store.add(call("z", trace="t4"))
    assert store.get("dup") is None and store.tree("dup") is None


def test_a_child_joins_its_own_callers_parent_when_request_ids_and_traces_collide():
    store = TraceStore()
    for c in (call("dup", caller="a", at=1.0), call("dup", caller="b", at=2.0),
              call("a-kid", "dup", caller="a", at=3.0), call("b-kid", "dup", caller="b", at=4.0)):
        store.add(c)

    def who(node):
        return (node.call.request_id, node.call.caller, [who(kid) for kid in node.children])

    assert who(store.tree("a-kid")) == ("dup", "a", [("a-kid", "a", [])])
    assert who(store.tree("b-kid")) == ("dup", "b", [("b-kid", "b", [])])


def test_another_caller_nests_only_under_a_call_that_reached_an_agent():
    store = TraceStore()
    store.add(call("refused", caller="a"))
    store.add(call("served", caller="a", forwarded=True))
    store.add(call("kid-1", "refused", caller="agent"))
    store.add(call("kid-2", "served", caller="agent"))
    assert shape(store.tree("kid-1")) == ("kid-1", [])
    assert shape(store.tree("kid-2")) == ("served", [("kid-2", [])])


def test_a_chain_deeper_than_the_bound_is_cut_not_a_crash():
    store = TraceStore()
    store.add(call("c0"))
    for n in range(1, 20 * MAX_TREE_DEPTH):
        store.add(call(f"c{n}", f"c{n - 1}"))
    node, depth = store.tree("c0"), 1
    while node.children:
        node, depth = node.children[0], depth + 1
    assert depth == MAX_TREE_DEPTH
    assert store.tree(f"c{20 * MAX_TREE_DEPTH - 1}") is not None

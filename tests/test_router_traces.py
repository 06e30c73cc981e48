"""The trace store: recent calls by request_id, assembled into call trees by trace_id."""

from router.traces import CallTrace, TraceStore


def call(request_id, parent=None, trace="t1", capability="cap.a"):
    return CallTrace(request_id=request_id, capability=capability, trace_id=trace, started_at=0.0,
                     parent_request_id=parent)


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

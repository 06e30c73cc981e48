"""The mesh's contract (mesh/): stored bytes and feed lines keep their layout, and the registry's
state and a router's mirror read the same key space alike."""

from __future__ import annotations

from agent_reach.registration import Capability

from auth.records import ClientRecord
from mesh.alerts import AlertConfig
from mesh.policy import BreakerConfig, Policy, RetryConfig, StickyConfig, TimeoutConfig
from mesh.records import (
    ALERTS_KEY,
    AgentIdBinding,
    InstanceRecord,
    binding_key,
    decode_binding,
    decode_value,
    encode_value,
    instance_key,
    policy_key,
)
from mesh.watch import Delete, InstanceState, Ping, Put, Reset, States, WatchEvent, decode_event, encode_event
from registry.state import RegistryState
from registry.store import Change
from router.mirror import RegistryMirror

INSTANCE = InstanceRecord(
    agent_id="a-1", service="svc",
    capabilities=[Capability(name="echo", endpoint="http://127.0.0.1:9/atp", idempotent=True,
                             trust_level="internal", examples=["hi"])],
    health_url="http://127.0.0.1:9/healthz", metadata={"zone": "z1"}, base_url="http://127.0.0.1:9/",
    direct_fallback=True, registered_at=12.5, evicted_at=99.0, token_id="t-1")
POLICY = Policy(
    capability="echo", policy="hash", affinity=StickyConfig(enabled=True, key="user", ttl_seconds=60),
    timeout=TimeoutConfig(connect_ms=200, first_byte_ms=500, total_ms=900),
    retry=RetryConfig(enabled=True, max_attempts=3),
    circuit_breaker=BreakerConfig(error_threshold_percent=25, min_requests=5, reset_seconds=2.5, window_seconds=10,
                                  half_open_probes=2),
    fallback_capability="echo2")
ALERTS = AlertConfig(reach_threshold=0.9, consecutive_periods=3, min_failures=7)
BINDING = AgentIdBinding(service="svc", released_at=5.25)

# Written by the layout before mesh/ existed (registry/records.py, router/policy.py, router/reach.py,
# registry/bindings.py): a data dir from then must replay into the same objects.
STORED = {
    "instance": (INSTANCE, bytes.fromhex(
        "8aa86167656e745f6964a3612d31a773657276696365a3737663ac6361706162696c6974696573918aa46e616d65a46563686f"
        "a8656e64706f696e74b6687474703a2f2f3132372e302e302e313a392f617470a776657273696f6ea3312e30a870726f746f636f"
        "6ca3617470ae74696d656f75745f736c615f6d73cd7530b16d61785f7061796c6f61645f6279746573ce00100000ab6465736372"
        "697074696f6ea0a86578616d706c657391a26869aa6964656d706f74656e74c3ab74727573745f6c6576656ca8696e7465726e61"
        "6caa6865616c74685f75726cba687474703a2f2f3132372e302e302e313a392f6865616c74687aa86d6574616461746181a47a6f"
        "6e65a27a31a8626173655f75726cb3687474703a2f2f3132372e302e302e313a392faf6469726563745f66616c6c6261636bc3ad"
        "726567697374657265645f6174cb4029000000000000aa657669637465645f6174cb4058c00000000000a8746f6b656e5f6964a3"
        "742d31")),
    "policy": (POLICY, bytes.fromhex(
        "87aa6361706162696c697479a46563686fa6706f6c696379a468617368a8616666696e69747983a7656e61626c6564c3a36b6579"
        "a475736572ab74746c5f7365636f6e64733ca774696d656f757483aa636f6e6e6563745f6d73ccc8ad66697273745f627974655f"
        "6d73cd01f4a8746f74616c5f6d73cd0384a5726574727982a7656e61626c6564c3ac6d61785f617474656d70747303af63697263"
        "7569745f627265616b657285b76572726f725f7468726573686f6c645f70657263656e7419ac6d696e5f72657175657374730"
        "5ad72657365745f7365636f6e6473cb4004000000000000ae77696e646f775f7365636f6e64730ab068616c665f6f70656e5f70"
        "726f62657302b366616c6c6261636b5f6361706162696c697479a56563686f32")),
    "alerts": (ALERTS, bytes.fromhex(
        "83af72656163685f7468726573686f6c64cb3feccccccccccccdb3636f6e73656375746976655f706572696f647303ac6d696e5f"
        "6661696c7572657307")),
}
OLD_BINDING = bytes.fromhex("82a773657276696365a3737663ab72656c65617365645f6174cb4015000000000000")
KEYS = {"instance": instance_key("a-1"), "policy": policy_key("echo"), "alerts": ALERTS_KEY}

# Lines of `GET /watch` as the registry wrote them before mesh/ existed; routers of either layout read them.
FEED = [
    (Reset(revision=3, records={"instances/a-1": INSTANCE, "policies/echo": POLICY, "settings/alerts": ALERTS},
           states={"a-1": InstanceState("healthy", 0.5, 2)}),
     b'{"type":"reset","revision":3,"records":{"instances/a-1":{"agent_id":"a-1","service":"svc","capabilities":'
     b'[{"name":"echo","endpoint":"http://127.0.0.1:9/atp","version":"1.0","protocol":"atp","timeout_sla_ms":30000,'
     b'"max_payload_bytes":1048576,"description":"","examples":["hi"],"idempotent":true,"trust_level":"internal"}],'
     b'"health_url":"http://127.0.0.1:9/healthz","metadata":{"zone":"z1"},"base_url":"http://127.0.0.1:9/",'
     b'"direct_fallback":true,"registered_at":12.5,"evicted_at":99.0,"token_id":"t-1"},"policies/echo":'
     b'{"capability":"echo","policy":"hash","affinity":{"enabled":true,"key":"user","ttl_seconds":60},"timeout":'
     b'{"connect_ms":200,"first_byte_ms":500,"total_ms":900},"retry":{"enabled":true,"max_attempts":3},'
     b'"circuit_breaker":{"error_threshold_percent":25,"min_requests":5,"reset_seconds":2.5,"window_seconds":10,'
     b'"half_open_probes":2},"fallback_capability":"echo2"},"settings/alerts":{"reach_threshold":0.9,'
     b'"consecutive_periods":3,"min_failures":7}},"states":{"a-1":["healthy",0.5,2]}}'),
    (Put(revision=4, key="policies/echo", value=POLICY),
     b'{"type":"put","revision":4,"key":"policies/echo","value":{"capability":"echo","policy":"hash","affinity":'
     b'{"enabled":true,"key":"user","ttl_seconds":60},"timeout":{"connect_ms":200,"first_byte_ms":500,'
     b'"total_ms":900},"retry":{"enabled":true,"max_attempts":3},"circuit_breaker":{"error_threshold_percent":25,'
     b'"min_requests":5,"reset_seconds":2.5,"window_seconds":10,"half_open_probes":2},'
     b'"fallback_capability":"echo2"}}'),
    (Delete(revision=5, key="instances/a-1"), b'{"type":"delete","revision":5,"key":"instances/a-1"}'),
    (States(states={"a-1": InstanceState("degraded", 1.0, None)}),
     b'{"type":"states","states":{"a-1":["degraded",1.0,null]}}'),
    (Ping(revision=6), b'{"type":"ping","revision":6}'),
]


def test_records_written_by_the_old_layout_decode_and_encode_to_the_same_bytes():
    for name, (record, stored) in STORED.items():
        assert decode_value(KEYS[name], stored) == record, name
        assert encode_value(record) == stored, name
    assert decode_binding(OLD_BINDING) == BINDING
    assert encode_value(BINDING) == OLD_BINDING


def test_feed_lines_keep_their_layout_both_ways():
    for event, line in FEED:
        assert encode_event(event) == line + b"\n"
        assert decode_event(line) == event


def instance(agent_id: str, service: str, *names: str, evicted_at: float | None = None) -> InstanceRecord:
    return InstanceRecord(agent_id=agent_id, service=service, health_url="http://127.0.0.1:9/healthz",
                          capabilities=[Capability(name=name, endpoint=f"http://127.0.0.1:9/{name}") for name in names],
                          evicted_at=evicted_at)


CLIENT = ClientRecord(client_id="c-1", name="caller", trust_level="internal", grants=["echo"],
                      secret_digest="s" * 64, api_key_digest="k" * 64, created_at=1.0)
# (key, record or None for a delete): registrations, re-registrations with other capabilities, an eviction,
# a deregistration, policies, alert settings and a credential, set and taken back.
HISTORY: list[tuple[str, object | None]] = [
    (instance_key("a1"), instance("a1", "svc", "echo", "shout")),
    (instance_key("a2"), instance("a2", "svc", "echo")),
    (instance_key("b1"), instance("b1", "other", "count")),
    (policy_key("echo"), POLICY),
    (policy_key("count"), Policy(policy="least_load")),
    (ALERTS_KEY, ALERTS),
    ("clients/c-1", CLIENT),
    (binding_key("gone"), BINDING),
    (instance_key("a1"), instance("a1", "svc", "shout")),
    (instance_key("a2"), instance("a2", "svc", "echo", evicted_at=50.0)),
    (instance_key("b1"), None),
    (policy_key("count"), None),
    (instance_key("a3"), instance("a3", "svc", "echo", "shout")),
    (instance_key("a1"), instance("a1", "svc", "echo", "shout")),
]


def feed_events(history: list[tuple[str, object | None]]) -> list[WatchEvent]:
    """What the hub publishes for these changes, through the HTTP codec as a remote router reads it."""
    events: list[WatchEvent] = []
    for revision, (key, record) in enumerate(history, start=1):
        # The hub sends a binding's Put without a value: its decode_value has no type for the key.
        value = decode_value(key, encode_value(record)) if record is not None else None
        event = Delete(revision=revision, key=key) if record is None else Put(revision=revision, key=key, value=value)
        events.append(decode_event(encode_event(event)[:-1]))
    return events


def registry_state(history: list[tuple[str, object | None]]) -> RegistryState:
    state = RegistryState(clock=lambda: 100.0)
    for revision, (key, record) in enumerate(history, start=1):
        state.apply(Change(key, encode_value(record) if record is not None else None, revision))
    return state


def indexed(holders) -> dict[str, list[str]]:
    return {name: list(offers) for name, offers in holders.items()}


def test_the_registry_and_a_router_read_every_prefix_of_the_history_alike():
    for length in range(len(HISTORY) + 1):
        history = HISTORY[:length]
        state = registry_state(history)
        mirror = RegistryMirror()
        for event in feed_events(history):
            mirror.apply(event)
        assert indexed(mirror.keys.offers) == indexed(state.keys.offers), length
        assert {name: state.owner(name) for name in mirror.capability_names()} == {
            name: mirror.offers(name)[0].record.service for name in mirror.capability_names()}
        assert mirror.keys.records == state.records
        assert mirror.instances == {agent_id: record for agent_id, record in state.records.items()
                                    if record.evicted_at is None}
        assert set(state.liveness) == set(mirror.instances)
        assert {name: mirror.policy(name) for name in ("echo", "count")} == {
            name: state.policies.get(name) for name in ("echo", "count")}
        assert state.alerts == (mirror.alerts or AlertConfig())
        assert mirror.auth.clients == state.auth.clients


def test_the_whole_history_ends_as_expected_and_a_reset_rebuilds_it():
    state = registry_state(HISTORY)
    # a1 re-registered with echo after a3 took it: a changed record goes to the back of each index.
    assert indexed(state.keys.offers) == {"shout": ["a3", "a1"], "echo": ["a3", "a1"]}
    assert list(state.records) == ["a1", "a2", "a3"] and state.records["a2"].evicted_at == 50.0
    assert state.policies == {"echo": POLICY} and state.alerts == ALERTS
    assert state.bindings == {"gone": "svc"} and state.auth.clients == {"c-1": CLIENT}
    mirror = RegistryMirror()
    for event in feed_events(HISTORY):
        mirror.apply(event)
    snapshot: dict[str, object] = {}
    for key, record in HISTORY:
        snapshot.pop(key, None)
        if record is not None:
            snapshot[key] = record
    records = {key: decode_value(key, encode_value(record)) for key, record in snapshot.items()}
    rebuilt = RegistryMirror()
    rebuilt.apply(decode_event(encode_event(Reset(revision=len(HISTORY), records=records, states={}))[:-1]))
    assert indexed(rebuilt.keys.offers).keys() == indexed(mirror.keys.offers).keys()
    assert rebuilt.instances.keys() == mirror.instances.keys() and rebuilt.revision == mirror.revision
    assert rebuilt.policy("echo") == POLICY and rebuilt.alerts == ALERTS and rebuilt.auth.clients == {"c-1": CLIENT}


def test_taking_back_the_alert_settings_returns_each_reader_to_its_own_default():
    history = [(ALERTS_KEY, ALERTS), (ALERTS_KEY, None)]
    mirror = RegistryMirror()
    for event in feed_events(history):
        mirror.apply(event)
    assert registry_state(history).alerts == AlertConfig() and mirror.alerts is None


def test_a_changed_instance_record_forgets_its_soft_state_in_the_mirror():
    mirror = RegistryMirror()
    for event in feed_events(HISTORY[:3]):
        mirror.apply(event)
    mirror.apply(States(states={"a1": InstanceState("healthy", 0.1, 0), "b1": InstanceState("healthy", 0.2, 0)}))
    mirror.apply(Put(revision=4, key=instance_key("a1"), value=instance("a1", "svc", "echo")))
    mirror.apply(Put(revision=5, key=policy_key("echo"), value=POLICY))
    assert set(mirror.states) == {"b1"} and mirror.offers("shout") is None
    assert [offer.state.state for offer in mirror.offers("echo") or []] == ["pending", "pending"]

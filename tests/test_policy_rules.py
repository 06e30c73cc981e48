"""Rule tables: the pure decision, the registry's validation, and calls through a real registry, router and
agents on loopback (first match wins and says why, an unhealthy target skipped, shadow rules counted but
never obeyed, the rule kept in traces and the audit trail)."""

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import wait_for
from mesh.policy import Policy, PolicyError, Rule, validate_policy
from mesh.records import decode_value, encode_value, policy_key
from router.audit import AuditFilter, AuditLog
from router.candidate import Candidate
from router.rules import CallerFacts, Decision, decide, minute_of_week, ordered, shadow_verdicts
from router_support import Mesh


def rule(**fields: Any) -> Rule:
    return msgspec.convert(fields, Rule)


def instance(agent_id: str, version: str, state: str = "healthy", zone: str = "", available: bool = True) -> Candidate:
    return Candidate(agent_id=agent_id, endpoint="http://127.0.0.1:9/call", protocol="rest", state=state,
                     version=version, metadata={"zone": zone}, available=available)


POOLS = {"summarize": [instance("small", "1.2.0", zone="local"), instance("large", "2.0.0", zone="cloud")],
         "summarize.cloud": [instance("cloud-1", "5.0.0")]}
TABLE = ordered([
    rule(id="r40", priority=40, match={"context": {"type": "summary"}}, target={"capability": "summarize.cloud"}),
    rule(id="r10", priority=10, match={"context": {"type": "intent"}}, target={"version": "^1"}),
    rule(id="r20", priority=20, match={"context": {"source": "internal"}}, target={"version": "^2", "zone": "cloud"},
         reason="internal code generation goes to the large model"),
    rule(id="r30", priority=30, match={"context": {"sensitivity": "high"}}, action="refuse"),
    rule(id="r35", priority=35, match={"client": "cl_partner", "trust_level": "public"}, action="degrade",
         target={"version": "^1"}),
]).rules


ANONYMOUS = CallerFacts()


def decided(context: dict[str, Any], pools: dict[str, list[Candidate]] = POOLS, caller: CallerFacts = ANONYMOUS,
            version: str | None = None) -> Decision:
    return decide(TABLE, "summarize", context, version, caller, lambda name: pools.get(name, []))


def test_first_match_by_priority_wins_and_says_why():
    both = decided({"type": "intent", "source": "internal"})
    assert (both.rule, both.versions) == ("r10", ("^1",))
    assert both.reason == "rule r10 (priority 10) matched context.type='intent'"
    internal = decided({"source": "internal"})
    assert (internal.rule, internal.versions, internal.zone) == ("r20", ("^2",), "cloud")
    assert internal.reason == "internal code generation goes to the large model"
    assert decided({"type": "summary"}).capability == "summarize.cloud"
    assert decided({"sensitivity": "high", "type": "summary"}).action == "refuse"
    none = decided({"type": "other"})
    assert (none.rule, none.capability, none.versions, none.reason) == (None, "summarize", (), None)


def test_match_needs_every_condition_and_exact_types():
    assert decided({"type": 1}).rule is None
    assert decided({}, caller=CallerFacts(client_id="cl_partner", trust_level="internal")).rule is None
    partner = decided({}, caller=CallerFacts(client_id="cl_partner", trust_level="public"))
    assert (partner.rule, partner.action) == ("r35", "degrade")


MONDAY, FRIDAY, SATURDAY = 0, 4 * 1440, 5 * 1440


def at(day: int, clock: str) -> CallerFacts:
    return CallerFacts(minute_of_week=day + int(clock[:2]) * 60 + int(clock[3:]))


def test_a_time_window_matches_its_hours_and_days_only_and_wraps_past_midnight():
    office = ordered([rule(id="office", priority=5, match={"hours": {"start": "09:00", "end": "17:30",
                                                                       "days": ["mon", "tue", "wed", "thu", "fri"]}},
                           target={"version": "^2"})]).rules
    night = ordered([rule(id="night", priority=5, match={"hours": {"start": "22:00", "end": "06:00"}},
                          target={"version": "^1"})]).rules

    def rule_at(table: list[Rule], caller: CallerFacts) -> str | None:
        return decide(table, "summarize", {}, None, caller, lambda name: POOLS.get(name, [])).rule

    assert [rule_at(office, at(MONDAY, clock)) for clock in ("08:59", "09:00", "17:29", "17:30")] == \
        [None, "office", "office", None]
    assert rule_at(office, at(SATURDAY, "10:00")) is None
    assert [rule_at(night, at(FRIDAY, clock)) for clock in ("21:59", "22:00", "23:59", "00:00", "05:59", "06:00")] \
        == [None, "night", "night", "night", "night", None]
    assert rule_at(night, CallerFacts()) is None  # no clock given: a window never matches
    assert decide(office, "summarize", {}, None, at(MONDAY, "10:00"),
                  lambda name: POOLS.get(name, [])).reason == \
        "rule office (priority 5) matched hours 09:00-17:30 UTC on mon,tue,wed,thu,fri"
    assert minute_of_week(0) == 3 * 1440  # 1970-01-01 was a Thursday, 00:00 UTC


def test_a_rule_whose_target_has_no_healthy_instance_falls_to_the_next():
    small_down = {**POOLS, "summarize": [instance("small", "1.2.0", state="pending"), POOLS["summarize"][1]]}
    fallen = decided({"type": "intent", "source": "internal"}, small_down)
    assert fallen.rule == "r20"
    assert fallen.reason == "internal code generation goes to the large model (skipped r10: no healthy instance " \
                            "in the target)"
    broken = {**POOLS, "summarize": [instance("small", "1.2.0", available=False), POOLS["summarize"][1]]}
    assert decided({"type": "intent"}, broken) == Decision(
        capability="summarize", reason="no rule decided (skipped r10: no healthy instance in the target)")
    assert decided({"type": "summary"}, {"summarize": POOLS["summarize"]}).rule is None  # no cloud instance


def test_the_frames_version_binds_its_own_capability_only():
    assert decided({"type": "intent"}, version=">=1.1").versions == (">=1.1", "^1")
    assert decided({"type": "intent"}, version=">=3").rule is None  # r10's target: nothing is >=3 and ^1
    assert decided({"type": "summary"}, version=">=3").versions == ()


def test_shadow_rules_never_decide_but_say_where_they_would_have_sent():
    table = ordered([*TABLE, rule(id="s5", priority=5, mode="shadow", match={"context": {"type": "intent"}},
                                  target={"version": "^2"})]).rules
    live = decide(table, "summarize", {"type": "intent"}, None, CallerFacts(), lambda name: POOLS.get(name, []))
    assert live.rule == "r10"
    [(rule_id, would)] = shadow_verdicts(table, "summarize", {"type": "intent"}, None, CallerFacts(),
                                         lambda name: POOLS.get(name, []))
    assert (rule_id, would.rule, would.versions) == ("s5", "s5", ("^2",)) and not would.same_target(live)


@pytest.mark.parametrize(("rules", "field", "words"), [
    ([{"id": "a", "priority": 10}, {"id": "b", "priority": 10}], "rules[1].priority", "priority 10"),
    ([{"id": "a", "priority": 10}, {"id": "a", "priority": 20}], "rules[1].id", "used twice"),
    ([{"id": "a", "priority": 10, "target": {"version": ">=4,<3"}}], "rules[0].target.version", "no version"),
    ([{"id": "a", "priority": 10, "target": {"version": "latest"}}], "rules[0].target.version", "not a version"),
    ([{"id": "a", "priority": 10, "action": "refuse", "target": {"zone": "x"}}], "rules[0].target", "refuses"),
])
def test_contradictions_name_the_field(rules: list[dict[str, Any]], field: str, words: str):
    with pytest.raises(PolicyError) as raised:
        validate_policy(msgspec.convert({"rules": rules}, Policy), "summarize")
    assert raised.value.field == field and words in raised.value.message


async def put(mesh: Mesh, capability: str, body: Any) -> tuple[int, Any]:
    async with mesh.http.put(f"{mesh.registry.url}/policies/{capability}", json=body, headers=mesh.admin) as answer:
        return answer.status, await answer.json()


@pytest.mark.parametrize(("rules", "field"), [
    ([{"id": "a", "priority": 10}, {"id": "b", "priority": 10}], "rules[1].priority"),
    ([{"id": "a", "priority": 10, "colour": "red"}], "rules[0].colour"),
    ([{"id": "a", "priority": 10, "match": {"contxt": {}}}], "rules[0].match.contxt"),
    ([{"id": "a", "priority": 10, "target": {"version": ">=4,<3"}}], "rules[0].target.version"),
    ([{"id": "a", "priority": 10, "action": "reroute"}], "rules[0].action"),
    ([{"id": "a", "priority": 10, "match": {"hours": {"start": "9:00", "end": "17:00"}}}],
     "rules[0].match.hours.start"),
    ([{"id": "a", "priority": 10, "match": {"hours": {"start": "09:00", "end": "09:00"}}}], "rules[0].match.hours.end"),
    ([{"id": "a", "priority": 10, "match": {"hours": {"start": "09:00", "end": "17:00", "days": ["mo"]}}}],
     "rules[0].match.hours.days[0]"),
])
async def test_a_bad_rule_table_is_refused_and_changes_nothing(mesh: Mesh, rules: list[dict[str, Any]], field: str):
    before = await mesh.put_policy("summarize", {"rules": [{"id": "keep", "priority": 1}]})
    status, body = await put(mesh, "summarize", {"rules": rules})
    assert status == 400 and body["field"] == field, body
    assert body["error"] and body["message"]
    async with mesh.http.get(f"{mesh.registry.url}/policies/summarize", headers=mesh.admin) as answer:
        assert msgspec.convert(await answer.json(), Policy) == before


async def summarize_mesh(mesh: Mesh, start_agent: Any, small_healthy: bool = True) -> dict[str, Any]:
    agents = {name: await start_agent(name) for name in ("small", "large", "cloud-1")}
    await mesh.add(agents["small"], "summarize", version="1.2.0", metadata={"zone": "local"}, healthy=small_healthy)
    await mesh.add(agents["large"], "summarize", version="2.0.0", metadata={"zone": "cloud"})
    await mesh.add(agents["cloud-1"], "summarize.cloud", version="5.0.0")
    await mesh.put_policy("summarize", {"rules": [msgspec.to_builtins(r) for r in reversed(TABLE)]})
    return agents


async def test_calls_follow_the_first_matching_rule_and_the_route_says_which(mesh: Mesh, start_agent: Any):
    agents = await summarize_mesh(mesh, start_agent)
    both = await mesh.call("summarize", {}, context={"type": "intent", "source": "internal"}, request_id="both-1")
    assert both.status == 200 and both.body["result"]["agent"] == "small"
    assert (both.route["rule"], both.route["version"], both.route["instance"]) == ("r10", "1.2.0", "small")
    assert both.route["reason"] == "rule r10 (priority 10) matched context.type='intent'"
    internal = await mesh.call("summarize", {}, context={"source": "internal"})
    assert (internal.route["rule"], internal.route["instance"]) == ("r20", "large")
    elsewhere = await mesh.call("summarize", {}, context={"type": "summary"})
    assert (elsewhere.route["rule"], elsewhere.route["capability"], elsewhere.route["version"]) == \
        ("r40", "summarize.cloud", "5.0.0")
    refused = await mesh.call("summarize", {}, context={"sensitivity": "high"})
    assert refused.status == 403 and refused.body["error_code"] == "FORBIDDEN"
    assert refused.route["rule"] == "r30" and "r30" in refused.body["error_message"]
    plain = await mesh.call("summarize", {}, context={"type": "other"})
    assert plain.status == 200 and "rule" not in plain.route
    assert (agents["cloud-1"].calls, agents["small"].calls + agents["large"].calls) == (1, 3)  # none refused
    trace = (await mesh.get("/traces/both-1"))["call"]
    assert (trace["rule"], trace["version"]) == ("r10", "1.2.0")
    stats = await mesh.get("/rules/stats?capability=summarize")
    assert {(hit["rule"], hit["calls"]) for hit in stats["hits"]} == {("r10", 1), ("r20", 1), ("r40", 1), ("r30", 1)}


async def test_an_unhealthy_target_falls_to_the_next_rule(mesh: Mesh, start_agent: Any):
    agents = await summarize_mesh(mesh, start_agent, small_healthy=False)
    answer = await mesh.call("summarize", {}, context={"type": "intent", "source": "internal"})
    assert answer.status == 200 and answer.route["rule"] == "r20" and answer.route["instance"] == "large"
    assert "skipped r10" in answer.route["reason"]
    assert agents["small"].calls == 0


async def test_shadow_rules_change_nothing_and_count_agreement(mesh: Mesh, start_agent: Any):
    agents = await summarize_mesh(mesh, start_agent)
    shadows = [{"id": "s5", "priority": 5, "mode": "shadow", "match": {"context": {"type": "intent"}},
                "target": {"version": "^2"}},
               {"id": "s6", "priority": 6, "mode": "shadow", "match": {"context": {"type": "intent"}},
                "target": {"version": "^1"}}]
    await mesh.put_policy("summarize", {"rules": [*shadows, *(msgspec.to_builtins(r) for r in TABLE)]})
    for n in range(20):
        answer = await mesh.call("summarize", {}, context={"type": "intent"})
        assert (answer.route["rule"], answer.route["instance"]) == ("r10", "small"), n
    assert agents["large"].calls == 0
    await mesh.call("summarize", {}, context={"type": "other"})  # matches no shadow rule: counted nowhere

    async def judged() -> dict[str, Any] | None:
        shadow = {row["rule"]: row for row in (await mesh.get("/rules/stats"))["shadow"]}
        return shadow if sum(row["agree"] + row["disagree"] for row in shadow.values()) == 40 else None
    shadow = await wait_for(judged, timeout=5, what="every shadow verdict")
    assert (shadow["s5"]["agree"], shadow["s5"]["disagree"], shadow["s6"]["agree"], shadow["s6"]["disagree"]) == \
        (0, 20, 20, 0)
    sample = shadow["s5"]["samples"][-1]
    assert len(shadow["s5"]["samples"]) == 5
    assert (sample["would"]["rule"], sample["would"]["versions"], sample["did"]["rule"]) == ("s5", ["^2"], "r10")


async def test_the_audit_trail_keeps_the_rule(start_mesh: Any, start_agent: Any, tmp_path: Path):
    mesh = await start_mesh(router_settings={"audit_path": tmp_path / "audit.db"})
    await summarize_mesh(mesh, start_agent)
    await mesh.call("summarize", {}, context={"source": "internal"}, request_id="audited-1")

    async def row() -> dict[str, Any] | None:
        entries = (await mesh.get("/audit?request_id=audited-1"))["entries"]
        return entries[0] if entries else None
    assert (await wait_for(row, timeout=5, what="the audit row"))["rule"] == "r20"


async def test_an_audit_trail_from_before_rules_gains_the_column(tmp_path: Path):
    path = tmp_path / "audit.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE audit (id INTEGER PRIMARY KEY, time REAL NOT NULL, capability TEXT NOT NULL, "
                   "request_id TEXT NOT NULL, outcome TEXT NOT NULL, latency_ms REAL NOT NULL, caller TEXT, "
                   "caller_name TEXT, instance TEXT, trace_id TEXT, parent_request_id TEXT, error_code TEXT, "
                   "payload_bytes INTEGER NOT NULL, payload_sha256 TEXT, auth_method TEXT)")
        db.execute("INSERT INTO audit (time, capability, request_id, outcome, latency_ms, payload_bytes) "
                   "VALUES (1.0, 'old', 'old-1', 'success', 1.0, 0)")
    audit = AuditLog(path, retention_days=100_000.0)
    await audit.start()
    try:
        [old] = await audit.query(AuditFilter())
        assert (old.request_id, old.rule) == ("old-1", None)
    finally:
        await audit.stop()


def test_a_rule_table_is_sorted_once_per_stored_list():
    rules = [rule(id="b", priority=20), rule(id="a", priority=10, mode="shadow")]
    table = ordered(rules)
    assert [r.id for r in table.rules] == ["a", "b"] and table.has_shadow
    assert ordered(rules) is table
    other = ordered([rule(id="c", priority=5)])
    assert [r.id for r in other.rules] == ["c"] and not other.has_shadow


async def test_a_rule_never_sends_a_caller_where_its_grants_do_not_reach(start_mesh: Any, start_agent: Any):
    mesh = await start_mesh(auth=True)
    agents = await summarize_mesh(mesh, start_agent)
    caller = await mesh.new_client(["summarize"])
    answer = await mesh.call("summarize", {}, context={"type": "summary"}, headers={"X-API-Key": caller["api_key"]})
    assert answer.status == 200 and answer.route["capability"] == "summarize", answer.body
    assert "skipped r40" in answer.route["reason"] and agents["cloud-1"].calls == 0


def test_the_new_members_are_stored_only_when_given():
    plain = msgspec.convert({"policy": "hash"}, Policy)
    assert b"rules" not in encode_value(plain) and b"degradation" not in msgspec.json.encode(plain)
    assert (plain.rule_list, plain.shares, plain.rollback_config, plain.mirror_config) == ([], [], None, None)
    assert plain.degradation_config.level == "L2"
    ruled = msgspec.convert({"rules": [{"id": "r1", "priority": 1}], "degradation": {"level": "L1"}}, Policy)
    assert decode_value(policy_key("echo"), encode_value(ruled)) == ruled
    assert [rule.id for rule in ruled.rule_list] == ["r1"] and ruled.degradation_config.level == "L1"

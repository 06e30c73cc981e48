"""Client budgets at the registry: the client record's budget fields (admin API and CLI), bad input
refused naming the field, the account's leases (never past the budget, an ask repeated changes nothing
twice) and the account surviving a restart. Real registries on 127.0.0.1, the CLI as a child process."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from auth.records import ClientRecord
from conftest import admin_key, call
from mesh.budgets import (
    BudgetAccount,
    LeaseRequest,
    Limits,
    RouterShare,
    account_key,
    lease,
    period_bounds,
)
from mesh.records import decode_value, encode_value
from test_cli_security import admin, agentreach

CLIENT = {"name": "app", "trust_level": "internal", "grants": ["echo"]}


async def created(http: Any, registry: Any, key: str, **fields: Any) -> dict[str, Any]:
    status, body = await call(http, "POST", f"{registry.url}/clients", key, {**CLIENT, **fields})
    assert status == 201, body
    return body


async def ask(http: Any, registry: Any, key: str, client_id: str, **fields: Any) -> dict[str, Any]:
    status, body = await call(http, "POST", f"{registry.url}/budgets/{client_id}/lease", key,
                              {"router_id": "r-1", **fields})
    assert status == 200, body
    return body


def test_periods_are_calendar_hours_days_and_months_in_utc():
    moment = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC).timestamp()
    assert period_bounds("hour", moment) == (datetime(2026, 12, 31, 23, tzinfo=UTC).timestamp(),
                                             datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    assert period_bounds("day", moment) == (datetime(2026, 12, 31, tzinfo=UTC).timestamp(),
                                            datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    assert period_bounds("month", moment) == (datetime(2026, 12, 1, tzinfo=UTC).timestamp(),
                                              datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    february = datetime(2028, 2, 29, 12, tzinfo=UTC).timestamp()
    assert period_bounds("month", february)[1] == datetime(2028, 3, 1, tzinfo=UTC).timestamp()


def test_leases_never_commit_more_than_the_budget_and_overshoot_eats_into_it():
    limits = Limits(tokens=100, cost=None, period="day")
    account = BudgetAccount(client_id="c", period="day", period_start=0.0)
    granted = 0
    for router in ("a", "b") * 30:
        account, grant = lease(account, limits, LeaseRequest(router_id=router, want_tokens=3))
        granted = sum(share.granted_tokens for share in account.routers.values())
        assert granted <= 100 and grant.left_tokens == 100 - granted
    assert granted == 100
    # Router a reports it spent 10 past its lease (calls in flight when it ran out): that is committed too.
    spent = account.routers["a"].granted_tokens + 10
    account, grant = lease(account, limits, LeaseRequest(router_id="a", period_start=0.0, spent_tokens=spent))
    assert grant.share == RouterShare(granted_tokens=spent, spent_tokens=spent) and grant.left_tokens == 0


def test_an_ask_repeated_after_a_lost_answer_is_not_counted_twice():
    limits = Limits(tokens=1000, cost=2.0, period="day")
    account = BudgetAccount(client_id="c", period="day", period_start=0.0)
    account, first = lease(account, limits, LeaseRequest(router_id="a", want_tokens=10, want_cost=0.5))
    ask = LeaseRequest(router_id="a", period_start=0.0, spent_tokens=40, spent_cost=0.1, want_tokens=20)
    account, second = lease(account, limits, ask)
    again, third = lease(account, limits, ask)
    # Spend is cumulative (max of what was reported), so the repeat records nothing new; it is granted anew.
    assert again.routers["a"].spent_tokens == 40 and third.share.spent_cost == 0.1
    assert first.share.granted_tokens == 50 and first.share.granted_cost == 0.5  # 5% chunk, or the want if more
    assert second.share.granted_tokens == 100 and third.share.granted_tokens == 150


def test_an_ask_wanting_nothing_reports_and_a_release_gives_back_what_was_not_spent():
    limits = Limits(tokens=1000, cost=None, period="day")
    account = BudgetAccount(client_id="c", period="day", period_start=0.0)
    account, _ = lease(account, limits, LeaseRequest(router_id="a", want_tokens=300))
    account, reported = lease(account, limits, LeaseRequest(router_id="a", period_start=0.0, spent_tokens=120))
    assert reported.share == RouterShare(granted_tokens=300, spent_tokens=120) and reported.left_tokens == 700
    account, released = lease(account, limits, LeaseRequest(router_id="a", period_start=0.0, spent_tokens=130,
                                                            release=True))
    assert released.share == RouterShare(granted_tokens=130, spent_tokens=130) and released.left_tokens == 870


async def test_a_client_is_created_with_a_budget_and_its_budget_changed(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    client = await created(http, registry, key, budget_tokens=5000, budget_period="day")
    status, shown = await call(http, "GET", f"{registry.url}/clients/{client['client_id']}", key)
    assert status == 200 and (shown["budget_tokens"], shown["budget_cost"], shown["budget_period"]) == (
        5000, None, "day")
    status, changed = await call(http, "PUT", f"{registry.url}/clients/{client['client_id']}/budget", key,
                                 {"budget_cost": 2.5, "budget_period": "month"})
    assert status == 200 and (changed["budget_tokens"], changed["budget_cost"], changed["budget_period"]) == (
        None, 2.5, "month")
    record = registry.registry.state.auth.clients[client["client_id"]]
    assert (record.budget_tokens, record.budget_cost, record.budget_period) == (None, 2.5, "month")
    status, removed = await call(http, "PUT", f"{registry.url}/clients/{client['client_id']}/budget", key, {})
    assert status == 200 and removed["budget_period"] is None


def test_a_client_without_a_budget_keeps_its_stored_bytes():
    record = ClientRecord(client_id="c-1", name="caller", trust_level="internal", grants=["echo"],
                          secret_digest="s", api_key_digest="k", created_at=1.0, rate_limit_qps=5.0)
    stored = encode_value(record)
    assert b"budget" not in stored and decode_value("clients/c-1", stored) == record


@pytest.mark.parametrize(("body", "field"), [
    ({"budget_tokens": -1, "budget_period": "day"}, "budget_tokens"),
    ({"budget_tokens": 0, "budget_period": "day"}, "budget_tokens"),
    ({"budget_cost": -0.5, "budget_period": "day"}, "budget_cost"),
    ({"budget_cost": 1e16, "budget_period": "day"}, "budget_cost"),
    ({"budget_tokens": 10, "budget_period": "week"}, "budget_period"),
    ({"budget_tokens": 10}, "budget_period"),
    ({"budget_period": "hour"}, "budget_period"),
    ({"budget_tokens": "many", "budget_period": "day"}, "budget_tokens"),
])
async def test_a_bad_budget_is_refused_naming_the_field_and_nothing_is_stored(start_registry, http, body, field):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    status, refused = await call(http, "POST", f"{registry.url}/clients", key, {**CLIENT, **body})
    assert (status, refused["field"]) == (400, field), refused
    assert registry.registry.state.auth.clients == {}
    client = await created(http, registry, key)
    status, refused = await call(http, "PUT", f"{registry.url}/clients/{client['client_id']}/budget", key, body)
    assert (status, refused["field"]) == (400, field), refused
    assert registry.registry.state.auth.clients[client["client_id"]].budget_period is None


async def test_a_budget_for_an_unknown_client_is_refused_naming_it(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    budget = {"budget_tokens": 10, "budget_period": "day"}
    status, refused = await call(http, "PUT", f"{registry.url}/clients/cli_nobody/budget", key, budget)
    assert (status, refused["error"], refused["field"]) == (404, "client_not_found", "client_id")
    status, refused = await call(http, "POST", f"{registry.url}/budgets/cli_nobody/lease", key, {"router_id": "r"})
    assert (status, refused["field"]) == (404, "client_id")
    client = await created(http, registry, key)
    status, refused = await call(http, "GET", f"{registry.url}/budgets/{client['client_id']}", key)
    assert (status, refused["error"], refused["field"]) == (404, "no_budget", "client_id")
    status, refused = await call(http, "POST", f"{registry.url}/budgets/{client['client_id']}/lease", key,
                                 {"router_id": "r", "spent_tokens": -5})
    assert (status, refused["field"]) == (400, "spent_tokens")
    async with http.post(f"{registry.url}/budgets/{client['client_id']}/lease", headers={"X-API-Key": key},
                         data=b'{"router_id": "r", "spent_cost": 1e999}') as response:
        assert response.status == 400 and (await response.json())["field"] == "spent_cost"
    status, _ = await call(http, "POST", f"{registry.url}/budgets/{client['client_id']}/lease", None,
                           {"router_id": "r"})
    assert status == 401


async def test_the_account_survives_a_restart(start_registry, http, tmp_path):
    data = tmp_path / "kept"
    registry = await start_registry(data, auth=True)
    key = admin_key(registry)
    client_id = (await created(http, registry, key, budget_tokens=1000, budget_period="day"))["client_id"]
    first = await ask(http, registry, key, client_id, want_tokens=600)
    start = first["period_start"]
    await ask(http, registry, key, client_id, period_start=start, spent_tokens=550)
    status, before = await call(http, "GET", f"{registry.url}/budgets/{client_id}", key)
    assert status == 200 and before["spent_tokens"] == 550 and before["committed_tokens"] == 600
    await registry.stop()

    again = await start_registry(data, auth=True)
    status, after = await call(http, "GET", f"{again.url}/budgets/{client_id}", key)
    assert status == 200 and after == before
    # Another router gets only what is left, and then nothing.
    other = await ask(http, again, key, client_id, router_id="r-2", want_tokens=1000)
    assert other["share"]["granted_tokens"] == 400 and other["left_tokens"] == 0
    assert (await ask(http, again, key, client_id, router_id="r-3", want_tokens=1))["share"].get(
        "granted_tokens", 0) == 0
    stored = again.registry.store.snapshot()[account_key(client_id)]
    assert b"r-2" in stored and datetime.fromtimestamp(after["reset_at"], UTC).hour == 0


async def test_the_cli_creates_a_client_with_a_budget_and_changes_it(start_registry):
    registry = await start_registry(auth=True)
    client = await admin("clients", "create", "--name", "app", "--trust", "internal", "--grant", "echo",
                         "--budget-tokens", "20000", "--budget-period", "day", registry=registry)
    record = registry.registry.state.auth.clients[client["client_id"]]
    assert (record.budget_tokens, record.budget_period) == (20000, "day")
    changed = await admin("clients", "budget", client["client_id"], "--budget-cost", "7.5", "--budget-period",
                          "hour", registry=registry)
    assert (changed["budget_tokens"], changed["budget_cost"], changed["budget_period"]) == (None, 7.5, "hour")
    refused = await agentreach("clients", "budget", "cli_nobody", "--budget-tokens", "5", "--budget-period", "day",
                               "--registry", registry.url, "--data-dir", str(registry.settings.data_dir))
    assert refused.returncode == 1 and "404 client_not_found" in refused.stderr
    assert "(field: client_id)" in refused.stderr
    negative = await agentreach("clients", "create", "--name", "x", "--trust", "internal", "--grant", "echo",
                                "--budget-tokens", "-3", "--budget-period", "day",
                                "--registry", registry.url, "--data-dir", str(registry.settings.data_dir))
    assert negative.returncode == 1 and "400" in negative.stderr and "(field: budget_tokens)" in negative.stderr


async def test_the_cli_refuses_a_cost_json_cannot_carry(start_registry):
    registry = await start_registry(auth=True)
    refused = await agentreach("clients", "create", "--name", "x", "--trust", "internal", "--grant", "echo",
                               "--budget-cost", "nan", "--budget-period", "day",
                               "--registry", registry.url, "--data-dir", str(registry.settings.data_dir))
    assert refused.returncode == 2 and "--budget-cost must be a finite number" in refused.stderr
    assert registry.registry.state.auth.clients == {}

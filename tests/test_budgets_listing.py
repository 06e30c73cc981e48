"""GET /budgets: every budgeted client's account for the period in one answer, a page of at most ``limit``
in client id order continued with ``after``; and the console's /api/clients reading it once per refresh
instead of GET /budgets/{client_id} per client (a real registry with auth on, a console in front of a
recording relay to it, over HTTP on 127.0.0.1)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from conftest import admin_key, call
from recording_support import Received, RecordingServer
from test_budgets_registry import ask, created


async def listed(http: Any, url: str, key: str | None, query: str = "") -> tuple[int, Any]:
    return await call(http, "GET", f"{url}/budgets{query}", key)


async def test_the_accounts_of_budgeted_clients_are_listed_a_page_at_a_time(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    budgeted = [await created(http, registry, key, budget_tokens=100 * n, budget_period="day") for n in (1, 2, 3)]
    costly = await created(http, registry, key, budget_cost=2.5, budget_period="month")
    await created(http, registry, key)  # no budget: no account
    await ask(http, registry, key, budgeted[1]["client_id"], spent_tokens=0, want_tokens=30)
    ids = sorted(client["client_id"] for client in [*budgeted, costly])

    status, whole = await listed(http, registry.url, key)
    assert status == 200 and whole["next_after"] is None, whole
    assert [account["client_id"] for account in whole["budgets"]] == ids
    for account in whole["budgets"]:
        assert (await call(http, "GET", f"{registry.url}/budgets/{account['client_id']}", key)) == (200, account)
    [leased] = [a for a in whole["budgets"] if a["client_id"] == budgeted[1]["client_id"]]
    assert leased["committed_tokens"] == 30 and leased["budget_tokens"] == 200

    pages, after = [], ""
    while after is not None:
        status, page = await listed(http, registry.url, key, f"?limit=3&after={after}")
        assert status == 200 and len(page["budgets"]) <= 3, page
        pages.append([account["client_id"] for account in page["budgets"]])
        after = page["next_after"]
    assert pages == [ids[:3], ids[3:]]

    status, _ = await call(http, "PUT", f"{registry.url}/clients/{costly['client_id']}/budget", key, {})
    assert status == 200
    status, fewer = await listed(http, registry.url, key)
    assert [account["client_id"] for account in fewer["budgets"]] == sorted(c["client_id"] for c in budgeted)


async def test_a_bad_page_size_is_refused_naming_it_and_only_the_admin_may_list(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    for bad in ("0", "1001", "-1", "x", "1.5"):
        status, body = await listed(http, registry.url, key, f"?limit={bad}")
        assert (status, body["error"], body["field"]) == (400, "invalid_field", "limit"), (bad, body)
    client = await created(http, registry, key, budget_tokens=10, budget_period="hour")
    assert (await listed(http, registry.url, None))[0] == 401
    status, refused = await listed(http, registry.url, client["api_key"])
    assert status == 403 and refused["error"], refused


async def test_the_console_reads_every_account_in_one_registry_read(start_registry, start_console, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)

    async def relayed(request: web.Request, received: Received) -> web.Response:
        async with http.request(received.method, f"{registry.url}{request.path_qs}", data=received.body or None,
                                headers={name: value for name, value in received.headers.items()
                                         if name.lower() in ("x-api-key", "authorization", "content-type")}) as reply:
            return web.Response(body=await reply.read(), status=reply.status, content_type="application/json")

    relay = await RecordingServer(relayed).start()
    try:
        clients = [await created(http, registry, key, budget_tokens=50, budget_period="day") for _ in range(4)]
        await created(http, registry, key)
        console = await start_console(relay.url, "http://127.0.0.1:9", admin_key=key)
        relay.received.clear()
        async with http.get(f"{console.url}/api/clients") as response:
            assert response.status == 200
            answer = await response.json()
        accounts = {c["client_id"]: c["account"] for c in answer["clients"]}
        assert all(accounts[c["client_id"]]["budget_tokens"] == 50 for c in clients), accounts
        reads = [received.path for received in relay.received if received.path.startswith("/budgets")]
        assert reads == ["/budgets"], reads
    finally:
        await relay.stop()


async def test_the_console_sets_and_clears_a_budget_through_the_registry_for_the_admin_only(start_registry,
                                                                                          start_console, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    client = await created(http, registry, key)
    console = await start_console(registry.url, "http://127.0.0.1:9", auth="on", admin_key=key)
    path = f"{console.url}/api/clients/{client['client_id']}/budget"
    budget = {"budget_tokens": 500, "budget_cost": 1.5, "budget_period": "hour"}
    assert (await call(http, "PUT", path, None, budget))[0] == 401
    assert (await call(http, "PUT", path, client["api_key"], budget))[0] == 401
    status, saved = await call(http, "PUT", path, key, budget)
    assert status == 200 and {name: saved[name] for name in budget} == budget, saved
    status, account = await call(http, "GET", f"{registry.url}/budgets/{client['client_id']}", key)
    assert status == 200 and account["budget_tokens"] == 500

    for bad, field in (({"budget_tokens": 0, "budget_period": "day"}, "budget_tokens"),
                       ({"budget_tokens": 10}, "budget_period"), ({"budget_cost": "lots", "budget_period": "day"},
                                                                  "budget_cost"),
                       ({"budget_tokens": 10, "budget_period": "week"}, "budget_period")):
        status, refused = await call(http, "PUT", path, key, bad)
        assert (status, refused["error"], refused["field"]) == (400, "invalid_field", field), (bad, refused)
    status, missing = await call(http, "PUT", f"{console.url}/api/clients/cli_nobody/budget", key, budget)
    assert (status, missing["field"]) == (404, "client_id"), missing
    assert (await call(http, "GET", f"{registry.url}/clients/{client['client_id']}", key))[1]["budget_tokens"] == 500

    status, cleared = await call(http, "PUT", path, key, {})
    assert status == 200 and cleared["budget_period"] is None and cleared["budget_tokens"] is None, cleared
    assert (await call(http, "GET", f"{registry.url}/budgets", key))[1]["budgets"] == []

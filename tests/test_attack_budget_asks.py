"""Attacks on the registry's lease asks: every budgeted client's lease runs out at once (a period begins at the
same moment for all of them), so every router asks for every client together. A real registry on 127.0.0.1."""

from __future__ import annotations

import asyncio

from conftest import admin_key, call
from test_budgets_registry import ask, created

CLIENTS = 40


async def test_asks_for_different_clients_are_not_written_one_after_another(http, start_registry):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    clients = [(await created(http, registry, key, budget_tokens=1000, budget_period="hour"))["client_id"]
               for _ in range(CLIENTS)]
    wal = registry.registry.store.wal
    before = wal.stats.batches

    grants = await asyncio.gather(*(ask(http, registry, key, client_id, want_tokens=10) for client_id in clients))

    assert all(grant["share"]["granted_tokens"] == 50 for grant in grants)
    # One account each: nothing orders them, so their writes share the log's group commits. Held behind one
    # lock for every client, each ask waited for the one before it to reach the disk: CLIENTS batches.
    assert wal.stats.batches - before < CLIENTS
    for client_id in clients:
        status, account = await call(http, "GET", f"{registry.url}/budgets/{client_id}", key)
        assert status == 200 and account["committed_tokens"] == 50

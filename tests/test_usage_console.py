"""The console's agent view shows each agent's tokens and their cost from real calls (headless chromium):
the agents table's Tokens and Cost columns, and the agent page's hour by hour history."""

from __future__ import annotations

import json
import sqlite3

import msgspec
from playwright.async_api import expect

from conftest import wait_for
from console.store import HOUR, ConsoleStore
from console.traffic import Sample
from console_support import Rig, screenshot
from router.reach import Tally

WAIT_MS = 10_000
CALLS = 3


async def column(page, table: str, label: str) -> list[str] | None:
    """The text of the column headed ``label`` in ``table``, row by row (None: no such table yet)."""
    return await page.evaluate("""([table, label]) => {
        const root = document.querySelector(table);
        if (!root) return null;
        const index = [...root.querySelectorAll("thead th")].findIndex((th) => th.textContent === label);
        return [...root.querySelectorAll("tbody tr")].map((tr) => tr.children[index].textContent);
    }""", [table, label])


async def shows(page, table: str, label: str, cells: list[str]) -> None:
    """Wait until the column reads ``cells`` (the console refreshes from the router's traces each second)."""
    async def shown() -> bool:
        return await column(page, table, label) == cells
    await wait_for(shown, timeout=WAIT_MS / 1000, what=f"{table} to show {label} {cells}")


async def test_the_agent_view_shows_tokens_and_cost_from_the_calls_served(rig: Rig, start_scripted, page):
    agent = await start_scripted("llm-1")
    agent.body = json.dumps({"text": "ok", "usage": {"prompt_tokens": 250, "completion_tokens": 250}}).encode()
    await rig.mesh.add(agent, "llm.chat", cost_per_call=0.25, cost_per_1k_input_tokens=8.0,
                       cost_per_1k_output_tokens=4.0)
    rig.mesh.keep_beating("llm-1", every=0.2)
    for _ in range(CALLS):
        assert (await rig.mesh.call("llm.chat", {"q": "hi"})).status == 200
    tokens, cost = f"{CALLS * 500:,}", f"{CALLS * (0.25 + 2.0 + 1.0):g}"

    await page.goto(f"{rig.url}/#/agents")
    row = page.locator('#agents-table tr[data-key="llm-1"]')
    await expect(row).to_be_visible(timeout=WAIT_MS)
    await shows(page, "#agents-table", "Tokens", [tokens])
    assert await column(page, "#agents-table", "Cost") == [cost]
    await screenshot(page, "agents-usage")

    await row.get_by_role("link", name="llm-1").click()
    await shows(page, "#hours", "Cost", [cost])
    assert await column(page, "#hours", "Tokens") == [tokens]
    assert await column(page, "#capabilities", "Cost") == [cost]
    await expect(page.locator("#traffic")).to_contain_text(cost)
    await screenshot(page, "agent-usage")


async def test_a_store_kept_before_calls_had_a_cost_gains_the_column_and_keeps_its_hours(tmp_path):
    path = tmp_path / "console.db"
    with sqlite3.connect(path) as old:  # agent_hours as the console kept it before usage had a cost
        old.executescript("""CREATE TABLE agent_hours (hour INTEGER NOT NULL, agent_id TEXT NOT NULL,
            capability TEXT NOT NULL, tally TEXT NOT NULL, tokens INTEGER NOT NULL,
            PRIMARY KEY (hour, agent_id, capability));""")
        old.execute("INSERT INTO agent_hours VALUES (?, 'a1', 'cap', ?, 5)", (HOUR, msgspec.json.encode(Tally())))
    store = ConsoleStore(path)
    await store.open()
    try:
        await store.add_samples([Sample(HOUR + 1, "a1", "cap", 10.0, None, 3, 0.75)], watermark=HOUR + 1)
        [hour] = await store.agent_hours("a1", since=HOUR)
        assert (hour.total, hour.tokens, hour.cost) == (1, 8, 0.75)
    finally:
        await store.close()

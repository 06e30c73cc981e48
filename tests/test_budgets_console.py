"""The console's Clients page shows each client's rate limit, budget, what it spent this period and when the
budget resets, from the registry's account (headless chromium against a real registry, a router following
it over HTTP with auth on, a real agent reporting 10 tokens a call)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.async_api import expect

from console_support import Rig, screenshot
from router.core import RouterSettings
from test_budgets_routers import metered, spend  # noqa: F401 (a fixture)
from test_usage_console import WAIT_MS, column, shows


async def test_the_clients_page_shows_budgets_spend_and_reset(start_mesh, start_console, metered,  # noqa: F811
                                                              http, page):
    # The router reports its spend every 50 ms, so the registry's account (what the page shows) is current.
    mesh = await start_mesh(follow="http", auth=True, routing=RouterSettings(budget_report_seconds=0.05))
    await mesh.add(await metered("llm-1"), "llm.chat")
    console = await start_console(mesh.registry.url, mesh.url, admin_key=mesh.admin_key)
    rig = Rig(mesh, console, http, mesh.admin_key)
    budgeted = await mesh.new_client(["llm.*"], name="batch", budget_tokens=1000, budget_period="day",
                                     rate_limit_qps=5)
    tight = await mesh.new_client(["llm.*"], name="tight", budget_tokens=20, budget_cost=2.5, budget_period="month")
    plain = await mesh.new_client(["llm.*"], name="plain")
    for _ in range(3):
        assert (await spend(mesh, budgeted["api_key"])).status == 200
    assert [(await spend(mesh, tight["api_key"])).status for _ in range(3)] == [200, 200, 429]

    [listed] = [c for c in (await rig.get("/api/clients"))["clients"] if c["client_id"] == budgeted["client_id"]]
    assert listed["account"]["budget_tokens"] == 1000
    await page.goto(f"{rig.url}/#/clients")
    table = "#clients-table"
    await expect(page.locator(f'{table} tr[data-key="{plain["client_id"]}"]')).to_be_visible(timeout=WAIT_MS)
    # Sorted by name: batch, plain, tight.
    await shows(page, table, "Spent this period", ["30 tokens (3 %)", "—",
                                                   "20 tokens (100 %), 0 cost (0 %), none left"])
    assert await column(page, table, "Budget") == ["1,000 tokens per day", "none", "20 tokens and 2.5 cost per month"]
    assert await column(page, table, "Rate limit") == ["5.00 calls/s", "none", "none"]
    [day, none, month] = await column(page, table, "Resets")
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert day == await page.evaluate("(at) => new Date(at * 1000).toLocaleString('en-GB', { hour12: false })",
                                      midnight.timestamp())
    assert month != "—" and none == "—"
    await screenshot(page, "clients-budgets")


async def test_an_operator_sets_and_clears_a_budget_on_the_clients_page(start_mesh, start_console, http, page):
    mesh = await start_mesh(auth=True)
    console = await start_console(mesh.registry.url, mesh.url, admin_key=mesh.admin_key)
    rig = Rig(mesh, console, http, mesh.admin_key)
    client = await mesh.new_client(["llm.*"], name="batch")
    await mesh.new_client(["llm.*"], name="other", budget_tokens=70, budget_period="hour")
    table, editor = "#clients-table", "#budget-editor"
    await page.goto(f"{rig.url}/#/clients")
    await expect(page.locator(f'{table} tr[data-key="{client["client_id"]}"]')).to_be_visible(timeout=WAIT_MS)
    await page.get_by_label("Client", exact=True).select_option(client["client_id"])
    tokens, period = page.get_by_label("Tokens per period"), page.get_by_label("Period", exact=True)

    await tokens.fill("0")
    await period.select_option("day")
    await page.get_by_role("button", name="Save budget").click()
    await expect(page.locator(f'{editor} .field[data-field="budget_tokens"] .field-error')).not_to_be_empty()
    await expect(page.locator(f"{editor} .error-summary")).to_contain_text("budget_tokens")
    await expect(tokens).to_be_focused()
    await tokens.fill("500")
    await period.select_option("")
    await page.get_by_role("button", name="Save budget").click()
    await expect(page.locator(f'{editor} .field[data-field="budget_period"] .field-error')).to_contain_text(
        "budget_period")
    await expect(page.locator(f'{editor} .field[data-field="budget_tokens"] .field-error')).to_be_empty()
    await period.select_option("day")
    await page.get_by_role("button", name="Save budget").click()
    await expect(page.locator(f"{editor} [role=status]")).to_contain_text("500 tokens per day", timeout=WAIT_MS)
    await shows(page, table, "Budget", ["500 tokens per day", "70 tokens per hour"])
    [stored] = [c for c in (await rig.get("/api/clients"))["clients"] if c["client_id"] == client["client_id"]]
    assert (stored["budget_tokens"], stored["budget_period"], stored["account"]["budget_tokens"]) == (500, "day", 500)
    await screenshot(page, "clients-budget-editor")

    await page.get_by_role("button", name="Remove budget").click()
    await expect(page.locator(f"{editor} [role=status]")).to_contain_text("Removed batch's budget", timeout=WAIT_MS)
    await shows(page, table, "Budget", ["none", "70 tokens per hour"])
    assert await tokens.input_value() == "" and await period.input_value() == ""
    [cleared] = [c for c in (await rig.get("/api/clients"))["clients"] if c["client_id"] == client["client_id"]]
    assert cleared["budget_period"] is None and cleared["account"] is None

"""The console's policy editor with rules: the rule table shown with the calls each rule decided and each
shadow rule's agreement, the rules kept when the form saves other fields, the JSON edited and refused
next to its field. API through the console, and a real browser (headless chromium)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from conftest import wait_for
from console_support import Rig

WAIT_MS = 10_000
RULES = {"rules": [
    {"id": "r10", "priority": 10, "match": {"context": {"type": "intent"}}, "target": {"version": "^1"}},
    {"id": "s5", "priority": 5, "mode": "shadow", "match": {"context": {"type": "intent"}}, "action": "degrade"},
]}


async def echo_with_rules(rig: Rig, start_agent: Any) -> None:
    await rig.mesh.add(await start_agent("a1"), "echo")
    await rig.mesh.put_policy("echo", RULES)
    for _ in range(3):
        assert (await rig.mesh.call("echo", {}, context={"type": "intent"})).route["rule"] == "r10"

    async def console_knows_echo() -> bool:  # the policies page lists what the console's last poll saw
        return any(entry["capability"] == "echo" for entry in (await rig.get("/api/policies"))["policies"])
    await wait_for(console_knows_echo, what="the console to see capability echo")


async def test_the_console_relays_the_rule_counts(rig: Rig, start_agent: Any):
    await echo_with_rules(rig, start_agent)

    async def counted() -> dict[str, Any] | None:
        stats = await rig.get("/api/rules/stats?capability=echo")
        return stats if stats["shadow"] and stats["shadow"][0]["disagree"] == 3 else None
    stats = await wait_for(counted, what="the shadow verdicts")
    assert stats["hits"] == [{"capability": "echo", "rule": "r10", "calls": 3}]
    assert (await rig.get("/api/rules/stats?capability=other")) == {"hits": [], "shadow": [], "mirror": []}


async def test_the_editor_shows_rules_with_hits_keeps_them_and_refuses_bad_ones_inline(rig: Rig, start_agent: Any,
                                                                                      page: Any):
    await echo_with_rules(rig, start_agent)
    await wait_for(lambda: rig.mesh.router.rules.shadows("echo"), what="the shadow verdicts")
    await page.goto(f"{rig.url}/#/policies/echo")
    rows = page.locator("#rules tbody tr")
    await expect(rows).to_have_count(2, timeout=WAIT_MS)
    await expect(page.locator('#rules tr[data-key="s5"]')).to_contain_text("0 / 3")
    await expect(page.locator('#rules tr[data-key="r10"]')).to_contain_text("3")
    form = page.locator("form.policy-form")
    await form.get_by_label("Connect, ms").fill("400")
    await form.get_by_role("button", name="Save policy").click()
    await expect(form.locator(".form-status")).to_contain_text("Saved", timeout=WAIT_MS)
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        stored = await response.json()
    assert stored["timeout"]["connect_ms"] == 400 and [rule["id"] for rule in stored["rules"]] == ["r10", "s5"]

    releases = form.get_by_label("Rules, split, rollback, mirror, degradation")
    await releases.fill('{"rules": [{"id": "a", "priority": 1}, {"id": "b", "priority": 1}]}')
    await form.get_by_role("button", name="Save policy").click()
    await expect(releases).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(page.locator("#f-releases-error")).to_contain_text("rules[1].priority")
    await releases.fill("{not json")
    await form.get_by_role("button", name="Save policy").click()
    await expect(page.locator("#f-releases-error")).to_contain_text("Not JSON")
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        assert [rule["id"] for rule in (await response.json())["rules"]] == ["r10", "s5"]


async def test_the_editor_saves_over_what_it_opened_and_refuses_a_policy_changed_meanwhile(rig: Rig,
                                                                                            start_agent: Any,
                                                                                            page: Any):
    await echo_with_rules(rig, start_agent)
    await page.goto(f"{rig.url}/#/policies/echo")
    form = page.locator("form.policy-form")
    status, summary = form.locator(".form-status"), form.locator(".error-summary")
    connect = form.get_by_label("Connect, ms")
    for value in ("400", "300"):  # the second save is based on the first: no conflict with its own write
        await connect.fill(value)
        await form.get_by_role("button", name="Save policy").click()
        await expect(status).to_contain_text("Saved", timeout=WAIT_MS)
        await expect(status).not_to_contain_text("Saving")
    await rig.mesh.put_policy("echo", {**RULES, "fallback_capability": "elsewhere"})  # another operator's edit

    await connect.fill("250")
    await form.get_by_role("button", name="Save policy").click()
    await expect(summary).to_contain_text("changed since you opened it — reload", timeout=WAIT_MS)
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        stored = await response.json()
    assert stored["fallback_capability"] == "elsewhere" and stored["timeout"]["connect_ms"] != 250

    await summary.get_by_role("button", name="Reload").click()
    await expect(form.get_by_label("Fallback capability")).to_have_value("elsewhere", timeout=WAIT_MS)
    await form.get_by_label("Connect, ms").fill("250")
    await form.get_by_role("button", name="Save policy").click()
    await expect(form.locator(".form-status")).to_contain_text("Saved", timeout=WAIT_MS)
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        stored = await response.json()
    assert stored["fallback_capability"] == "elsewhere" and stored["timeout"]["connect_ms"] == 250

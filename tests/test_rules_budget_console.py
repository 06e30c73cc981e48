"""The console's policy editor with a rule matching on budget use: the condition shown in the rule table,
and in the rules' JSON the form saves (a real registry and router, a real browser)."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import expect

from conftest import wait_for
from console_support import Rig

WAIT_MS = 10_000
RULES = {"rules": [{"id": "r40", "priority": 40, "match": {"context": {"type": "summary"}, "budget_used_above": 0.8},
                    "target": {"version": "^1"}, "action": "degrade"}]}


async def test_the_editor_shows_the_budget_condition_and_keeps_it(rig: Rig, start_agent: Any, page: Any):
    await rig.mesh.add(await start_agent("a1"), "echo")
    await rig.mesh.put_policy("echo", RULES)

    async def console_knows_echo() -> bool:
        return any(entry["capability"] == "echo" for entry in (await rig.get("/api/policies"))["policies"])
    await wait_for(console_knows_echo, what="the console to see capability echo")
    await page.goto(f"{rig.url}/#/policies/echo")
    await expect(page.locator('#rules tr[data-key="r40"]')).to_contain_text(
        'context.type = "summary", budget used > 80.0 %', timeout=WAIT_MS)
    # Rules are edited as JSON holding every stored member: saving the form sends the condition back unchanged.
    releases = page.locator("form.policy-form").get_by_label("Rules, split, rollback, mirror, degradation")
    await expect(releases).to_have_value(re.compile(r'"budget_used_above": 0\.8'))

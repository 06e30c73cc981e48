"""Attack on the console's policy editor creating a policy: opened for a capability with none stored, it must not
overwrite a policy another operator created meanwhile (it sends If-None-Match: *). API through the console, and a
real browser (headless chromium)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from conftest import wait_for
from console_support import Rig

WAIT_MS = 10_000


async def test_the_editor_creating_a_policy_refuses_to_overwrite_one_created_meanwhile(rig: Rig, start_agent: Any,
                                                                                       page: Any):
    await rig.mesh.add(await start_agent("a1"), "echo")

    async def console_knows_echo() -> bool:
        return any(entry["capability"] == "echo" for entry in (await rig.get("/api/policies"))["policies"])
    await wait_for(console_knows_echo, what="the console to see capability echo")
    await page.goto(f"{rig.url}/#/policies/echo")
    form = page.locator("form.policy-form")
    summary = form.locator(".error-summary")
    await expect(form.get_by_label("Connect, ms")).to_be_visible(timeout=WAIT_MS)
    await rig.mesh.put_policy("echo", {"fallback_capability": "elsewhere"})  # another operator creates one

    await form.get_by_label("Connect, ms").fill("250")
    await form.get_by_role("button", name="Save policy").click()
    await expect(summary).to_contain_text("changed since you opened it — reload", timeout=WAIT_MS)
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        assert (await response.json())["fallback_capability"] == "elsewhere"  # the other operator's, not overwritten

"""The console in a real browser (headless chromium): demo agents turning healthy on the home
page, a killed agent turning demoted, a policy edited (with an inline error first) and applied,
a debug frame answered and its trace opened. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import re

import aiohttp
from playwright.async_api import expect

from agentreach.demo import DemoAgents
from conftest import wait_for
from console_support import Rig, screenshot

WAIT_MS = 10_000


async def open_page(page, rig: Rig, route: str = "") -> None:
    await page.goto(f"{rig.url}/#/{route}")
    await expect(page.locator("main h1")).to_be_visible()


async def test_home_shows_the_demo_agents_turning_healthy(rig: Rig, page):
    await open_page(page, rig)
    await expect(page.locator("#auth-banner")).to_contain_text("Authentication off")
    await expect(page.locator("#stat-agents .stat-value")).to_have_text("0", timeout=WAIT_MS)
    demo = DemoAgents(rig.mesh.registry.url, rig.mesh.url)
    await demo.start()
    try:
        await expect(page.locator("#stat-agents .stat-value")).to_have_text("3", timeout=WAIT_MS)
        await expect(page.locator("#stat-available .stat-value")).to_have_text("3", timeout=WAIT_MS)
        await expect(page.locator("#up-registry")).to_have_attribute("data-ok", "yes")
        async with aiohttp.ClientSession() as session:
            for text in ("where is order A-1001", "hello"):
                frame = {"capability": "order.query", "payload": {"text": text}}
                async with session.post(f"{rig.mesh.url}/atp", json=frame):
                    pass
        await expect(page.locator("#stat-reach .stat-value")).not_to_have_text("—", timeout=WAIT_MS)
        await screenshot(page, "home")
        await page.get_by_role("link", name="Agents", exact=True).click()
        rows = page.locator("#agents-table tbody tr")
        await expect(rows).to_have_count(3)
        await expect(page.locator("#agents-table .badge-healthy")).to_have_count(3, timeout=WAIT_MS)
        await screenshot(page, "agents")
    finally:
        await demo.stop()


async def test_a_killed_agent_turns_demoted(start_rig, start_agent, page):
    rig: Rig = await start_rig(silence_timeout=1.0)
    victim, survivor = await start_agent("victim"), await start_agent("survivor")
    await rig.mesh.add_all([victim, survivor])
    for name in ("victim", "survivor"):
        rig.mesh.keep_beating(name, every=0.2)
    await open_page(page, rig, "agents")
    victim_row = page.locator('#agents-table tr[data-key="victim"]')
    await expect(victim_row.locator(".badge")).to_have_text("healthy", timeout=WAIT_MS)
    rig.mesh.stop_beating("victim")
    await victim.kill()
    await expect(victim_row.locator(".badge")).to_have_text("demoted", timeout=WAIT_MS)
    await expect(page.locator('#agents-table tr[data-key="survivor"] .badge')).to_have_text("healthy")
    await screenshot(page, "agent-demoted")
    await victim_row.get_by_role("link", name="victim").click()
    await expect(page.locator("main h1 .badge")).to_have_text("demoted")
    await expect(page.locator("#heartbeats .transitions li").first).to_contain_text("demoted")
    await screenshot(page, "agent-page")


async def test_a_policy_is_refused_inline_then_saved_and_applied(rig: Rig, start_agent, page):
    await rig.mesh.add_all([await start_agent("a1"), await start_agent("a2")])

    async def console_knows_echo() -> bool:  # the page lists what the console's last poll saw
        return any(entry["capability"] == "echo" for entry in (await rig.get("/api/policies"))["policies"])
    await wait_for(console_knows_echo, what="the console to see capability echo")
    await open_page(page, rig, "policies/echo")
    form = page.locator("form.policy-form")
    await form.get_by_label("Policy", exact=True).select_option("hash")
    await form.get_by_label("Connect, ms").fill("500")
    await form.get_by_label("First byte, ms").fill("100")
    await form.get_by_role("button", name="Save policy").click()
    connect = form.get_by_label("Connect, ms")
    await expect(connect).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#f-timeout-connect-ms-error")).to_contain_text("exceeds timeout.first_byte_ms")
    await expect(connect).to_be_focused()
    await screenshot(page, "policy-refused")
    await form.get_by_label("First byte, ms").fill("2000")
    await form.get_by_role("button", name="Save policy").click()
    await expect(form.locator(".form-status")).to_contain_text("Saved", timeout=WAIT_MS)
    await expect(connect).not_to_have_attribute("aria-invalid", "true")
    await screenshot(page, "policy-saved")
    async with rig.http.get(f"{rig.mesh.registry.url}/policies/echo") as response:
        stored = await response.json()
    assert stored["policy"] == "hash" and stored["timeout"]["first_byte_ms"] == 2000
    await wait_for(lambda: getattr(rig.mesh.router.mirror.policy("echo"), "policy", None) == "hash",
                   what="the router to apply the policy")
    await open_page(page, rig, "debug?capability=echo")
    await page.get_by_role("button", name="Send through the router").click()
    await expect(page.locator('#route-facts [data-fact="policy"] dd')).to_have_text("hash", timeout=WAIT_MS)


async def test_a_debug_frame_is_answered_and_its_trace_opens(rig: Rig, start_agent, page):
    await rig.mesh.add_all([await start_agent("a1")])
    await open_page(page, rig, "debug?capability=echo")
    await page.get_by_label("Payload (JSON)").fill('{"text": "is it the agent or the mesh?"}')
    await page.get_by_label("Request ID").fill("debug-trace-1")
    await page.get_by_role("button", name="Build frame").click()
    await expect(page.locator("#frame-text")).to_have_value(re.compile('"request_id": "debug-trace-1"'))
    await page.get_by_role("button", name="Send through the router").click()
    await expect(page.locator("#response-frame")).to_contain_text("is it the agent or the mesh?", timeout=WAIT_MS)
    await expect(page.locator('#route-facts [data-fact="instance"] dd')).to_have_text("a1")
    await expect(page.locator("#debug-result")).to_contain_text("HTTP 200")
    await screenshot(page, "debug")
    await page.get_by_role("link", name="Open its trace").click()
    await expect(page.locator("main h1")).to_contain_text("debug-trace-1")
    await expect(page.locator("#attempts tbody")).to_contain_text("a1", timeout=WAIT_MS)
    await expect(page.locator(".waterfall .wf-call")).to_have_count(1)
    await screenshot(page, "trace")

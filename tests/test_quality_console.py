"""Quality scores on the console (issue 15): relayed to a real registry through the console's API, edited
on an agent's page and alerted on the alerts page of a real browser."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import expect

from conftest import wait_for
from console_support import Rig, screenshot

WAIT_MS = 10_000


async def test_quality_is_relayed_to_the_registry(rig: Rig, start_agent: Any) -> None:
    agent_id = await rig.mesh.add(await start_agent("echo-1"), "echo")
    status, saved = await rig.request("PUT", f"/api/quality/echo/{agent_id}", {"score": 0.3, "source": "golden"})
    assert status == 200 and (saved["score"], saved["source"], saved["floor"]) == (0.3, "golden", None), saved
    assert [(v["agent_id"], v["score"]) for v in await rig.get("/api/quality/echo")] == [(agent_id, 0.3)]
    assert (await rig.request("PUT", "/api/policies/echo", {"quality_floor": 0.5}))[0] == 200
    alerts = (await rig.get("/api/quality"))["alerts"]
    assert [(a["agent_id"], a["score"], a["floor"]) for a in alerts] == [(agent_id, 0.3, 0.5)]
    await rig.until("/api/overview", lambda o: o["quality_alerts"] == 1, what="the overview to count the alert")
    status, refused = await rig.request("PUT", f"/api/quality/echo/{agent_id}", {"score": 3})
    assert status == 400 and refused["field"] == "score", refused
    status, missing = await rig.request("PUT", "/api/quality/nothing.here/echo-1", {"score": 0.3})
    assert status == 404 and missing["field"] == "capability", missing
    assert (await rig.request("GET", "/api/quality/echo/%2E%2E"))[0] == 404
    assert (await rig.request("DELETE", f"/api/quality/echo/{agent_id}"))[0] == 200
    assert await rig.get("/api/quality/echo") == [] and (await rig.get("/api/quality"))["alerts"] == []
    await rig.until("/api/overview", lambda o: o["quality_alerts"] == 0, what="the overview to drop the alert")


async def test_an_operator_edits_quality_on_the_agent_page_and_sees_the_alert(rig: Rig, start_agent: Any,
                                                                            page: Any) -> None:
    agent_id = await rig.mesh.add(await start_agent("echo-1"), "echo")
    assert (await rig.request("PUT", "/api/policies/echo", {"quality_floor": 0.5}))[0] == 200
    await page.goto(f"{rig.url}/#/agents/{agent_id}")
    row = page.locator("#quality tbody tr", has_text="echo")
    await expect(row).to_contain_text("—", timeout=WAIT_MS)
    await page.get_by_label("Quality score").fill("1.5")
    await page.get_by_role("button", name="Save score").click()
    await expect(page.locator("#quality .error-summary")).to_contain_text("score")
    await expect(page.get_by_label("Quality score")).to_be_focused()
    await page.get_by_label("Quality score").fill("0.2")
    await page.get_by_label("Source").fill("golden-set-2026-12")
    await page.get_by_role("button", name="Save score").click()
    await expect(row).to_contain_text("0.20", timeout=WAIT_MS)
    await expect(row).to_contain_text("below floor")
    await expect(row).to_contain_text("golden-set-2026-12")
    assert [v["score"] for v in await rig.get("/api/quality/echo")] == [0.2]
    await screenshot(page, "quality-agent")

    await expect(page.locator("#alert-count")).to_have_text("1", timeout=WAIT_MS)
    await page.goto(f"{rig.url}/#/alerts")
    alert = page.locator("#quality-alerts tbody tr", has_text=agent_id)
    await expect(alert).to_contain_text("0.50", timeout=WAIT_MS)
    await expect(alert).to_contain_text("0.20")
    await screenshot(page, "quality-alerts")

    await page.goto(f"{rig.url}/#/agents/{agent_id}")
    await page.get_by_label("Quality score").fill("0.9")
    await page.get_by_role("button", name="Save score").click()
    await expect(row).to_contain_text("in rotation", timeout=WAIT_MS)
    await page.get_by_role("button", name="Delete score").click()
    await expect(page.locator("#quality [role=status]")).to_contain_text("Deleted", timeout=WAIT_MS)
    assert await rig.get("/api/quality/echo") == []
    await page.goto(f"{rig.url}/#/alerts")
    await expect(page.locator("#quality-alerts")).to_contain_text("Every scored instance meets", timeout=WAIT_MS)
    await expect(page.locator("#alert-count")).to_be_hidden(timeout=WAIT_MS)


async def test_a_scored_call_shows_its_score_and_parts_on_the_debug_page(rig: Rig, start_agent: Any,
                                                                        page: Any) -> None:
    agent_id = await rig.mesh.add(await start_agent("echo-1"), "echo")
    assert (await rig.request("PUT", "/api/policies/echo", {"policy": "scored"}))[0] == 200
    assert (await rig.request("PUT", f"/api/quality/echo/{agent_id}", {"score": 0.75}))[0] == 200
    await wait_for(lambda: rig.mesh.router_server.mirror.quality("echo", agent_id) == 0.75,
                   what="the router to learn the policy and the score")
    await page.goto(f"{rig.url}/#/debug?capability=echo")
    await page.get_by_role("button", name="Send through the router").click()
    await expect(page.locator('#route-facts [data-fact="policy"] dd')).to_have_text("scored", timeout=WAIT_MS)
    await expect(page.locator('#route-facts [data-fact="score"] dd')).to_have_text(re.compile(r"^\d\.\d{3}"))
    parts = page.locator('#route-facts [data-fact="score-parts"] dd')
    for part in ("latency", "errors", "load", "cost", "quality 0.25"):
        await expect(parts).to_contain_text(part)
    await screenshot(page, "quality-debug-score")

    # The call's trace keeps the score it was routed by, and the trace page's Decision section shows it.
    request_id = await page.locator('[data-fact="request-id"] dd').inner_text()
    traced = (await rig.get(f"/api/traces/{request_id}"))["call"]
    assert traced["policy"] == "scored" and traced["explored"] in (True, False), traced
    assert traced["score_parts"]["quality"] == 0.25 and 0 <= traced["score"] <= 1
    await page.locator("#open-trace").click()
    decision = page.locator('#call [aria-label="Decision"]')
    await expect(decision).to_contain_text(f"{traced['score']:.3f}", timeout=WAIT_MS)
    await expect(decision).to_contain_text("quality 0.25")


async def test_the_routing_page_lists_every_instances_score(rig: Rig, start_agent: Any, page: Any) -> None:
    first = await rig.mesh.add(await start_agent("echo-1"), "echo")
    second = await rig.mesh.add(await start_agent("echo-2"), "echo")
    assert (await rig.request("PUT", "/api/policies/echo", {"policy": "scored", "quality_floor": 0.5}))[0] == 200
    assert (await rig.request("PUT", f"/api/quality/echo/{second}", {"score": 0.25}))[0] == 200
    await wait_for(lambda: rig.mesh.router_server.mirror.quality("echo", second) == 0.25,
                   what="the router to learn the policy and the score")
    answer = await rig.get("/api/scores/echo")
    assert answer["policy"] == "scored" and answer["quality_floor"] == 0.5
    assert {s["agent_id"]: s["below_quality_floor"] for s in answer["instances"]} == {first: False, second: True}
    assert (await rig.request("GET", "/api/scores/nothing.here"))[0] == 404
    await page.goto(f"{rig.url}/#/routes")
    await expect(page.locator("#scores")).to_contain_text("quality floor 0.5", timeout=WAIT_MS)
    await expect(page.locator("#scores tbody tr", has_text=second)).to_contain_text("0.25 below floor")
    await expect(page.locator("#scores tbody tr", has_text=first)).to_contain_text("latency 0.")
    await screenshot(page, "quality-scores")

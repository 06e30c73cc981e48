"""The console's review of learned examples (issue 17): listed, added, accepted, rejected and deleted
through the console's API, relayed to a real registry; and the same in a real browser."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from console_support import Rig, screenshot
from mesh.examples import example_id

WAIT_MS = 10_000


async def test_operators_review_learned_examples_through_the_console(rig: Rig, start_agent: Any) -> None:
    await rig.mesh.add(await start_agent("echo-1"), "echo")
    text = "say this back to me"
    # echo has no description: its first example is its first text, and routes nowhere else.
    status, added = await rig.request("POST", "/api/examples/echo", {"text": text})
    assert status == 201 and added["state"] == "accepted", added
    assert await rig.get("/api/examples") == [{"capability": "echo", "pending": 0, "accepted": 1, "rejected": 0,
                                               "auto_accept_at": None}]
    assert await rig.get("/api/examples/echo") == [{"id": example_id(text), "text": text, "state": "accepted",
                                                    "confirmations": 0, "source": "operator"}]
    status, rejected = await rig.request("POST", f"/api/examples/echo/{example_id(text)}/reject",
                                         {"reason": "not how people talk"})
    assert status == 200 and rejected["state"] == "rejected" and rejected["reason"] == "not how people talk"
    status, refused = await rig.request("PUT", "/api/examples/echo/settings", {"auto_accept_at": 0})
    assert status == 400 and refused["field"] == "auto_accept_at"
    status, _ = await rig.request("PUT", "/api/examples/echo/settings", {"auto_accept_at": 2})
    assert status == 200 and await rig.get("/api/examples/echo/settings") == {"auto_accept_at": 2}
    status, _ = await rig.request("DELETE", f"/api/examples/echo/{example_id(text)}")
    assert status == 200 and await rig.get("/api/examples/echo") == []
    status, missing = await rig.request("GET", "/api/examples/echo/%2E%2E")
    assert status == 404, missing


async def test_the_examples_page_is_served_and_in_the_navigation(rig: Rig) -> None:
    async with rig.http.get(f"{rig.url}/static/pages/examples.js") as response:
        assert response.status == 200 and "javascript" in response.content_type
    async with rig.http.get(f"{rig.url}/") as response:
        assert 'href="#/examples"' in await response.text()


async def test_examples_are_reviewed_on_the_console_page(rig: Rig, start_agent: Any, page: Any) -> None:
    await rig.mesh.add(await start_agent("echo-1"), "echo")
    confirmation = {"text": "repeat my words", "caller": "someone"}
    status, _ = await rig.request("POST", "/api/examples/echo/confirmations", confirmation)
    assert status == 200
    await page.goto(f"{rig.url}/#/examples")
    await expect(page.locator("main h1")).to_have_text("Learned examples")
    queue = page.locator("#queue tbody tr", has_text="echo")
    await expect(queue).to_contain_text("1")
    await queue.get_by_role("link", name="echo").click()
    await expect(page.locator("main h1")).to_have_text("Examples of echo")
    row = page.locator("#examples tbody tr", has_text="repeat my words")
    await expect(row).to_contain_text("pending")
    await row.get_by_role("button", name="Accept").click()
    await expect(row).to_contain_text("accepted", timeout=WAIT_MS)
    await page.get_by_label("New example").fill("say it again")
    await page.get_by_role("button", name="Add example").click()
    await expect(page.locator("#examples tbody tr", has_text="say it again")).to_contain_text("accepted",
                                                                                               timeout=WAIT_MS)
    await page.get_by_label("Auto-accept at (distinct callers)").fill("0")
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#example-settings .error-summary")).to_contain_text("auto_accept_at")
    await row.get_by_role("button", name="Reject").click()
    await expect(row).to_contain_text("rejected", timeout=WAIT_MS)
    await screenshot(page, "examples")
    await row.get_by_role("button", name="Delete").click()
    await expect(page.locator("#examples tbody tr", has_text="repeat my words")).to_have_count(0, timeout=WAIT_MS)
    assert [e["text"] for e in await rig.get("/api/examples/echo")] == ["say it again"]

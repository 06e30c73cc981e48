"""The console's pages as an operator reads them, in headless chromium against a real mesh: routing
decisions in words, callers by name, both reach lines visible, URLs broken only between their parts,
full request ids in a paged traces list, and a refused debug call that never claims agent time."""

from __future__ import annotations

from playwright.async_api import expect

from console_support import Rig, screenshot

WAIT_MS = 10_000

# How many lines the element spans, and which of its text runs are split across lines. It is looked
# up inside the script: the page re-renders every 2 s, and a handle could point at a detached copy.
BROKEN_BETWEEN_PARTS = """(selector) => {
  const element = document.querySelector(selector);
  const runs = [...element.childNodes].filter((node) => node.nodeType === Node.TEXT_NODE);
  const lines = (node) => { const range = document.createRange(); range.selectNodeContents(node);
                            return new Set([...range.getClientRects()].map((rect) => Math.round(rect.top))).size; };
  return { spans: new Set([...element.getClientRects()].map((rect) => Math.round(rect.top))).size,
           split: runs.filter((node) => lines(node) > 1).map((node) => node.textContent) };
}"""


async def sign_in(page, rig: Rig, route: str) -> None:
    await page.goto(f"{rig.url}/#/{route}")
    await page.get_by_label("Admin key").fill(rig.admin_key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#sign-out")).to_be_visible(timeout=WAIT_MS)


async def test_routing_decisions_read_as_words_and_a_trace_names_its_caller(auth_rig: Rig, start_agent, page):
    await auth_rig.mesh.add(await start_agent("a1"))
    desk = await auth_rig.mesh.new_client(["echo"], name="support-desk")
    assert (await auth_rig.mesh.call(payload="hi", request_id="named-1",
                                     headers={"X-API-Key": desk["api_key"]})).status == 200
    assert (await auth_rig.mesh.call(payload="hi", headers={"X-API-Key": "ark_not-a-key"})).status == 401
    assert (await auth_rig.mesh.call("payroll.export", headers={"X-API-Key": desk["api_key"]})).status == 403

    await sign_in(page, auth_rig, "routes")
    decisions = page.locator("#decisions")
    await expect(decisions.locator('[data-decision="unauthenticated"] .bar-label')).to_have_text(
        "Refused: no valid credential", timeout=WAIT_MS)
    await expect(decisions.locator('[data-decision="forbidden"] .bar-label')).to_have_text("Refused: not granted")
    await expect(decisions).not_to_contain_text("_")
    await screenshot(page, "routes-labels")

    await page.goto(f"{auth_rig.url}/#/traces/named-1")
    caller = page.locator('section[aria-label="Entry"] dd').nth(1)
    await expect(caller).to_contain_text("support-desk", timeout=WAIT_MS)
    await expect(caller).to_contain_text(desk["client_id"])
    await screenshot(page, "trace-caller")


async def test_the_debug_entry_calls_as_the_consoles_client_and_a_refused_call_claims_no_agent_time(
        auth_rig: Rig, start_agent, page):
    await auth_rig.mesh.add(await start_agent("a1"))
    await sign_in(page, auth_rig, "debug?capability=echo")
    own_client = page.get_by_label("The console's debug client (internal trust, granted this capability only)")
    await expect(own_client).to_be_checked()
    await page.get_by_role("button", name="Send through the router").click()
    await expect(page.locator("#debug-result")).to_contain_text("HTTP 200", timeout=WAIT_MS)
    await expect(page.locator('#route-facts [data-fact="instance"] dd')).to_have_text("a1")
    await screenshot(page, "debug-as-console")

    await page.get_by_label("A client, by its API key").check()
    await page.get_by_label("Caller API key").fill("ark_not-a-key")
    await page.get_by_role("button", name="Send through the router").click()
    await expect(page.locator("#debug-result")).to_contain_text("HTTP 401", timeout=WAIT_MS)
    timings = page.locator('#debug-result [data-fact="agent-and-network"] dd')
    await expect(timings).to_have_text("not reached: refused by the router")
    await screenshot(page, "debug-refused")


async def test_raw_success_draws_over_reach_so_equal_lines_both_show(rig: Rig, start_agent, page):
    await rig.mesh.add(await start_agent("a1"))
    for number in range(3):
        assert (await rig.mesh.call(payload=number)).status == 200
    await page.goto(f"{rig.url}/#/")
    lines = page.locator("#reach-curve svg path.line")
    await expect(lines).to_have_count(2, timeout=WAIT_MS)
    # Drawn last, the dashed raw-success line sits on top of the reach line where they are equal.
    await expect(lines.nth(0)).to_have_class("line s-reach")
    await expect(lines.nth(1)).to_have_class("line s-raw")
    dashes = await page.evaluate(
        "getComputedStyle(document.querySelectorAll('#reach-curve svg path.line')[1]).strokeDasharray")
    assert dashes not in ("", "none"), dashes
    await expect(page.locator("#reach-curve .legend .swatch.s-raw")).to_have_class("swatch s-raw dashed")
    await screenshot(page, "reach-lines")


async def test_a_long_health_url_breaks_between_its_parts(rig: Rig, page, http):
    health_url = ("http://127.0.0.1:9/health/checks/for-the-instance-with-a-rather-long-name/"
                  "and-another-segment-of-the-path/healthz?verbose=true&zone=cn-east-1")
    body = {"agent_id": "long-url-1", "service": "longurl", "health_url": health_url,
            "capabilities": [{"name": "longurl", "endpoint": "http://127.0.0.1:9/call/with/a/long/endpoint/path"}]}
    async with http.post(f"{rig.mesh.registry.url}/register", json=body) as response:
        assert response.status == 200
    await page.set_viewport_size({"width": 1024, "height": 900})
    await page.goto(f"{rig.url}/#/agents/long-url-1")
    url = page.locator("#facts code.url")
    await expect(url).to_have_text(health_url, timeout=WAIT_MS)
    layout = await page.evaluate(BROKEN_BETWEEN_PARTS, "#facts code.url")
    assert layout["spans"] > 1 and layout["split"] == [], layout
    await screenshot(page, "agent-long-url")


async def test_the_traces_list_shows_whole_request_ids_a_page_at_a_time(rig: Rig, start_agent, page):
    await rig.mesh.add(await start_agent("a1"))
    ids = [f"whole-request-id-{number:02d}-{'x' * 20}" for number in range(30)]
    for request_id in ids:
        assert (await rig.mesh.call(payload="x", request_id=request_id)).status == 200
    await page.goto(f"{rig.url}/#/traces")
    rows = page.locator("#recent tbody tr")
    await expect(rows).to_have_count(25, timeout=WAIT_MS)
    await expect(rows.first.locator("a")).to_have_text(ids[-1])
    await expect(page.locator("#recent")).to_contain_text("Calls 1–25")
    await expect(page.get_by_role("button", name="Newer")).to_be_disabled()
    await page.get_by_role("button", name="Older").click()
    await expect(rows).to_have_count(5)
    await expect(rows.last.locator("a")).to_have_text(ids[0])
    await expect(page.get_by_role("button", name="Older")).to_be_disabled()
    await expect(page.locator("#recent")).to_contain_text("Calls 26–30")
    height = await page.evaluate("document.documentElement.scrollHeight")
    assert height < 2000, height
    await screenshot(page, "traces-paged")
    await page.get_by_role("button", name="Newer").click()
    await expect(rows).to_have_count(25)

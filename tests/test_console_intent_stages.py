"""The console shows which embedding model decided an intent, and with what scores: the debug page's route
and the call's trace, for a call the operator's model (all-MiniLM-L6-v2) routed after the shipped one refused.
Screenshots go to tests/artifacts/."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.async_api import expect

from conftest import wait_for
from console_support import Rig, screenshot
from embed_model_support import MODEL_NAME
from router_support import capability
from semantic.calibrate import load_eval_set
from semantic.settings import SemanticSettings

EVAL = load_eval_set(Path(__file__).parent / "semantic_eval")
WAIT_MS = 10_000


async def test_debug_page_and_trace_name_each_model_asked(start_rig, start_agent, page, minilm_dir: Path):
    semantic = SemanticSettings(enabled=True, max_capabilities=100, embed_model=str(minilm_dir))
    rig: Rig = await start_rig(router_settings={"semantic": semantic})
    agent = await start_agent("eval-agent")
    await rig.mesh.register(
        "eval-agent",
        [capability(c.name, agent.endpoint, description=c.description, examples=c.examples) for c in EVAL.capabilities],
        service="eval",
    )
    await rig.mesh.ready("eval-agent")
    rule = {"threshold": 0.59, "margin": 0.2, "dimensions": 384}
    async with rig.http.put(f"{rig.mesh.registry.url}/intent-rules/{MODEL_NAME}", json=rule) as response:
        assert response.status == 200
    router = rig.mesh.router_server.semantic
    assert router is not None
    await wait_for(
        lambda: router.stages[1].source == "calibrated" and len(router.stages[1].index.names) == len(EVAL.capabilities),
        timeout=60,
        what="the operator model to index every capability with its stored rule",
    )

    await page.goto(f"{rig.url}/#/debug")
    frame = {"request_id": "intent-1", "intent": "search return flights to Barcelona", "payload": {}}
    await page.locator("#frame-text").fill(json.dumps(frame))
    await page.get_by_role("button", name="Send through the router").click()
    matched = page.locator('#route-facts [data-fact="matched-by"] li')
    await expect(matched).to_have_count(2, timeout=WAIT_MS)
    await expect(matched.nth(0)).to_contain_text("use-multilingual: unmatched · best flight.search")
    await expect(matched.nth(0)).to_contain_text("threshold 0.530")
    await expect(matched.nth(1)).to_contain_text(f"{MODEL_NAME}: routed · best flight.search")
    await expect(matched.nth(1)).to_contain_text("(threshold 0.590, margin 0.200)")
    await expect(page.locator('#route-facts [data-fact="capability"] dd')).to_have_text("flight.search")
    await screenshot(page, "debug-intent-stages")

    await page.get_by_role("link", name="Open its trace").click()
    await expect(page.locator("main h1")).to_contain_text("intent-1")
    traced = page.locator(".intent-stages li")
    await expect(traced).to_have_count(2, timeout=WAIT_MS)
    await expect(traced.nth(1)).to_contain_text(f"{MODEL_NAME}: routed · best flight.search")
    await screenshot(page, "trace-intent-stages")

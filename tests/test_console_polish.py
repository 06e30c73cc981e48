"""The console's open /healthz and /metrics, its paged traces list and the callers' names in a
trace, against a real mesh (auth on where it matters)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from conftest import http  # noqa: F401
from console_support import Rig, auth_rig, rig, start_console, start_rig  # noqa: F401
from router_support import start_agent, start_mesh  # noqa: F401


async def test_healthz_and_metrics_are_open_with_auth_on(auth_rig: Rig, http):
    await auth_rig.until("/api/overview", lambda o: o["registry"]["ok"] and o["router"]["ok"] and o["traces"]["ok"],
                         "the console to read the mesh")
    async with http.get(f"{auth_rig.url}/healthz") as response:
        assert response.status == 200 and response.content_type == "application/json"
        health = await response.json()
    assert health["status"] == "ok" and health["polls"] >= 1
    assert health["registry"]["ok"] and health["router"]["ok"] and health["traces"]["ok"]

    async with http.post(f"{auth_rig.url}/api/session", json={"admin_key": auth_rig.admin_key}) as response:
        assert response.status == 200
    async with http.get(f"{auth_rig.url}/metrics") as response:
        assert response.status == 200 and response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = await response.text()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    for part in ("registry", "router", "traces"):
        assert samples[("agentreach_console_upstream_up", (("part", part),))] == 1
    assert samples[("agentreach_console_polls_total", ())] >= 1
    assert samples[("agentreach_console_sessions", ())] == 1
    assert ("agentreach_console_live_streams", ()) in samples


async def test_the_traces_list_comes_in_pages(rig: Rig, start_agent):
    await rig.mesh.add(await start_agent("a1"))
    for number in range(7):
        assert (await rig.mesh.call(payload=number, request_id=f"page-{number}")).status == 200
    first = await rig.until("/api/traces?limit=3", lambda page: page["traces"] and page["traces"][0]["request_id"]
                            == "page-6", "the router to trace the calls")
    assert [t["request_id"] for t in first["traces"]] == ["page-6", "page-5", "page-4"]
    assert first["more"] is True and first["offset"] == 0
    last = await rig.get("/api/traces?limit=3&offset=6")
    assert [t["request_id"] for t in last["traces"]] == ["page-0"] and last["more"] is False
    for query, field in (("offset=-1", "offset"), ("offset=1000", "offset"), ("limit=0", "limit")):
        status, body = await rig.request("GET", f"/api/traces?{query}")
        assert status == 400 and body["field"] == field and body["error"] == "invalid_field", query


async def test_a_trace_names_its_callers(auth_rig: Rig, start_agent, http):
    await auth_rig.mesh.add(await start_agent("a1"))
    desk = await auth_rig.mesh.new_client(["echo"], name="support-desk")
    answer = await auth_rig.mesh.call(payload="hi", request_id="named-1", headers={"X-API-Key": desk["api_key"]})
    assert answer.status == 200
    trace = await auth_rig.get("/api/traces/named-1")
    assert trace["call"]["caller"] == desk["client_id"]
    assert trace["caller_names"] == {desk["client_id"]: "support-desk"}

"""The console's open /healthz and /metrics, its paged traces list and the callers' names in a
trace, against a real mesh (auth on where it matters)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from console_support import Rig


async def test_healthz_and_metrics_are_open_with_auth_on(auth_rig: Rig, http):
    await auth_rig.until("/api/overview", lambda o: o["registry"]["ok"] and o["router"]["ok"] and o["traces"]["ok"],
                         "the console to read the mesh")
    async with http.get(f"{auth_rig.url}/healthz") as response:
        assert response.status == 200 and response.content_type == "application/json"
        health = await response.json()
    assert health["status"] == "ok" and health["polls"] >= 1
    assert health["registry"]["ok"] and health["router"]["ok"] and health["traces"]["ok"]
    assert set(health["registry"]) == {"ok", "checked_at"}  # no reasons: they would name internal URLs

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


async def debug_as_console(rig: Rig, frame: bytes) -> dict:
    await rig.until("/api/policies", lambda answer: any(entry["capability"] == "echo" for entry in answer["policies"]),
                    "the console to see the echo capability")
    status, result = await rig.request("POST", "/api/debug?as=debug-client", raw=frame)
    assert status == 200, result
    return result


async def test_the_debug_entry_calls_as_the_consoles_own_client(auth_rig: Rig, start_agent, start_console, http,
                                                                 tmp_path):
    await auth_rig.mesh.add(await start_agent("a1"))
    frame = b'{"capability": "echo", "payload": {"text": "hi"}}'
    for _ in range(2):
        result = await debug_as_console(auth_rig, frame)
        assert result["http_status"] == 200 and result["frame"]["result"]["echo"] == {"text": "hi"}

    async def debug_clients() -> list[dict]:
        async with http.get(f"{auth_rig.mesh.registry.url}/clients", headers=auth_rig.mesh.admin) as response:
            return [client for client in (await response.json())["clients"] if client["name"] == "console debug"]
    [client] = await debug_clients()
    assert client["grants"] == ["echo"] and client["trust_level"] == "internal"

    # A console started again finds its client (and rotates it for a key it can hold) rather than adding one.
    again = await start_console(auth_rig.mesh.registry.url, auth_rig.mesh.url, tmp_path / "again", auth="on",
                                admin_key=auth_rig.admin_key)
    result = await debug_as_console(Rig(auth_rig.mesh, again, http, auth_rig.admin_key), frame)
    assert result["http_status"] == 200
    assert [client["client_id"] for client in await debug_clients()] == [client["client_id"]]
    # The first console's key was rotated away: refused once, it takes a new one.
    assert (await debug_as_console(auth_rig, frame))["http_status"] == 200
    assert [client["client_id"] for client in await debug_clients()] == [client["client_id"]]

    for body in (b'{"capability": "payroll.export", "payload": {}}', b"{not json", b'{"intent": "pay me"}'):
        status, refused = await auth_rig.request("POST", "/api/debug?as=debug-client", raw=body)
        assert status == 400 and refused["field"] == "capability" and refused["error"] == "invalid_field", body

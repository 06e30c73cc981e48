"""The console's JSON API, every endpoint the front end uses, against a real registry, router
and agents; plus what the console says when a part of the mesh is down or the input is bad."""

from __future__ import annotations

import asyncio

import pytest

from conftest import wait_for
from console_support import Rig
from router.core import RouterSettings
from sdk_support import refused_url


async def echo_mesh(rig: Rig, start_agent, *names: str) -> list:
    agents = [await start_agent(name) for name in names]
    await rig.mesh.add_all(agents)
    return agents


async def first_poll(rig: Rig) -> None:
    """Until the console has polled the router once. The route decisions it finds at its first poll are the
    baseline, not this hour's (the router may have counted them for days), so calls made before it are
    never in the decision hours."""
    await rig.until("/api/overview", lambda o: o["router"]["checked_at"], "the console's first poll of the router")


async def test_the_dashboard_and_its_modules_are_served(rig: Rig):
    async with rig.http.get(f"{rig.url}/") as response:
        page = await response.text()
        assert response.status == 200 and '<main id="main"' in page and "/static/app.js" in page
    for path, kind in (("/static/app.js", "javascript"), ("/static/pages/overview.js", "javascript"),
                       ("/static/console.css", "text/css")):
        async with rig.http.get(f"{rig.url}{path}") as response:
            assert response.status == 200 and kind in response.content_type, path
    assert await rig.get("/api/config") == {"auth": "off", "registry_url": rig.mesh.registry.url,
                                            "router_url": rig.mesh.url, "poll_interval": 0.2}


async def test_overview_counts_agents_instances_calls_and_reach(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1", "a2")
    await rig.mesh.register("never-beats",
                            [{"name": "echo", "endpoint": "http://127.0.0.1:9/call", "protocol": "rest"}],
                            service="echo")
    overview = await rig.until("/api/overview", lambda o: o["registered_agents"] == 3 and o["available_instances"] == 2,
                               "three registered, two available")
    assert overview["states"] == {"healthy": 2, "pending": 1}
    assert overview["registry"]["ok"] and overview["router"]["ok"]
    for i in range(20):
        assert (await rig.mesh.call(payload=i)).status == 200
    # The console polls the router on its own clock: one poll may land between two of the calls.
    overview = await rig.until("/api/overview", lambda o: o["calls_per_second"] > 0 and o["reach_rate"] == 1.0
                               and sum(point["total"] for point in o["curve"]) >= 20, "all 20 calls to show")
    assert overview["raw_success_rate"] == 1.0 and overview["instance_health_rate"] == pytest.approx(2 / 3)
    [point] = overview["curve"]
    assert (point["total"], point["success"]) == (20, 20) and point["latency_p95_ms"] > 0


async def test_stream_sends_the_latest_overview_at_once_and_then_every_poll(rig: Rig):
    async with rig.http.get(f"{rig.url}/api/stream?topics=overview,agents") as response:
        assert response.status == 200 and response.content_type == "text/event-stream"
        events = []
        while len(events) < 4:
            line = (await asyncio.wait_for(response.content.readline(), 5)).decode().strip()
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
    assert set(events) == {"overview", "agents"} and events.count("overview") >= 2
    status, body = await rig.request("GET", "/api/stream?topics=gossip")
    assert status == 400 and body["field"] == "topics"


async def test_agents_list_and_one_agents_page(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1")
    await rig.mesh.heartbeat("a1", load=0.4)
    agents = await rig.until("/api/agents", lambda b: b["agents"] and b["agents"][0]["load"] == 0.4, "the agent")
    [row] = agents["agents"]
    assert (row["agent_id"], row["service"], row["state"], row["capabilities"]) == ("a1", "echo", "healthy", ["echo"])
    assert row["heartbeat_age_ms"] is not None and row["traffic"]["calls"] == 0
    await rig.mesh.heartbeat("a1", load=0.5)
    detail = await rig.until("/api/agents/a1", lambda d: d["heartbeats"][-1]["load"] == 0.5, "the new heartbeat")
    assert detail["agent"]["agent_id"] == "a1" and [b["load"] for b in detail["heartbeats"]][-2:] == [0.4, 0.5]
    assert detail["transitions"][0]["state"] == "healthy" and detail["hours"] == []
    status, body = await rig.request("GET", "/api/agents/nobody")
    assert status == 404 and body["error"] == "unknown_agent"
    status, body = await rig.request("GET", "/api/agents/no%2Fbody")  # one path segment, passed on as one
    assert status == 404 and body["error"] == "unknown_agent" and "no/body" in body["message"]


async def test_agent_traffic_from_traces(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1")
    for i in range(5):
        await rig.mesh.call(payload=i)
    detail = await rig.until("/api/agents/a1", lambda d: d["traffic"]["calls"] == 5, "the agent's calls from traces")
    assert detail["capabilities"]["echo"]["calls"] == 5 and detail["traffic"]["latency_p99_ms"] > 0
    [hour] = (await rig.until("/api/agents/a1", lambda d: d["hours"], "the agent's hour"))["hours"]
    assert hour["total"] == 5


async def test_reach_and_routes_views(start_rig, start_agent):
    rig: Rig = await start_rig(routing=RouterSettings(period_seconds=0.3))
    agent = (await echo_mesh(rig, start_agent, "a1"))[0]
    await first_poll(rig)
    for i in range(4):
        await rig.mesh.call(payload=i)
    agent.status = 500
    await rig.mesh.call(payload="fails")
    view = await rig.until("/api/reach", lambda v: v["capabilities"] and v["capabilities"][0]["total"] == 5, "reach")
    [echo] = view["capabilities"]
    assert (echo["success"], echo["failed"], echo["failed_by_code"], echo["reach_rate"]) == \
        (4, 1, {"AGENT_ERROR": 1}, 0.8)
    assert view["period_seconds"] == 0.3 and view["instance_health_rate"] == 1.0
    view = await rig.until("/api/reach", lambda v: v["hours"] and v["hours"][0]["total"] == 5, "the hour folded")
    assert view["hours"][0]["failed"] == 1
    routes = await rig.until("/api/routes", lambda r: r["decisions"].get("least_load") == 5, "decisions")
    routes = await rig.until("/api/routes", lambda r: r["hours"], "decision hours")
    assert routes["hours"][0]["decisions"]["least_load"] == 5
    assert routes["decisions"]["least_load"] == 5


async def test_hours_are_there_after_the_console_restarts(start_rig, start_console, start_agent, tmp_path):
    rig: Rig = await start_rig(data_dir=tmp_path / "kept", routing=RouterSettings(period_seconds=0.3))
    await echo_mesh(rig, start_agent, "a1")
    await first_poll(rig)
    for i in range(3):
        await rig.mesh.call(payload=i)
    await rig.until("/api/reach", lambda v: v["hours"] and v["hours"][0]["total"] == 3, "the hour folded")
    await rig.console.stop()
    again = Rig(rig.mesh, await start_console(rig.mesh.registry.url, rig.mesh.url, tmp_path / "kept"), rig.http)
    view = await again.until("/api/reach", lambda v: v["hours"], "hours after the restart")
    assert view["hours"][0]["total"] == 3  # kept, and not counted twice
    assert (await again.get("/api/routes"))["hours"][0]["decisions"] == {"least_load": 3}


async def test_traces_list_and_one_trace(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1")
    answer = await rig.mesh.call(payload="x", request_id="req-console-1")
    assert answer.status == 200
    listed = await rig.get("/api/traces?limit=5&capability=echo")
    assert [t["request_id"] for t in listed["traces"]] == ["req-console-1"]
    one = await rig.get("/api/traces/req-console-1")
    assert one["call"]["attempts"][0]["instance"] == "a1" and one["tree"]["call"]["request_id"] == "req-console-1"
    status, body = await rig.request("GET", "/api/traces/missing")
    assert status == 404 and body["error"] == "trace_not_found"
    status, body = await rig.request("GET", "/api/traces?limit=lots")
    assert status == 400 and body["field"] == "limit"


async def test_policies_listed_saved_refused_with_the_field_and_reset(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1")
    body = await rig.until("/api/policies", lambda b: b["policies"], "the capability")
    [entry] = body["policies"]
    assert (entry["capability"], entry["service"], entry["stored"], entry["policy"]["policy"]) == \
        ("echo", "echo", False, None)
    status, saved = await rig.request("PUT", "/api/policies/echo", {"policy": "hash", "timeout": {"total_ms": 3000}})
    assert status == 200 and saved["policy"] == "hash"
    await wait_for(lambda: rig.mesh.router.mirror.policy("echo") is not None, what="the router to apply it")
    assert (await rig.mesh.call(payload=1)).route["policy"] == "hash"
    [entry] = (await rig.get("/api/policies"))["policies"]
    assert entry["stored"] and entry["policy"]["timeout"]["total_ms"] == 3000
    status, refused = await rig.request("PUT", "/api/policies/echo",
                                        {"timeout": {"connect_ms": 500, "first_byte_ms": 100}})
    assert status == 400 and refused["field"] == "timeout.connect_ms" and refused["error"] == "invalid_policy"
    status, refused = await rig.request("PUT", "/api/policies/echo", {"retry": {"max_attempts": "three"}})
    assert status == 400 and refused["field"] == "retry.max_attempts"
    status, _ = await rig.request("DELETE", "/api/policies/echo")
    assert status == 200 and not (await rig.get("/api/policies"))["policies"][0]["stored"]


async def test_alerts_and_their_thresholds(rig: Rig):
    alerts = await rig.get("/api/alerts")
    assert alerts["alerts"] == [] and alerts["config"]["reach_threshold"] == 0.98
    status, saved = await rig.request("PUT", "/api/settings/alerts",
                                      {"reach_threshold": 0.95, "consecutive_periods": 3, "min_failures": 10})
    assert status == 200 and saved["reach_threshold"] == 0.95
    assert (await rig.get("/api/settings/alerts"))["consecutive_periods"] == 3
    await rig.until("/api/alerts", lambda a: a["config"]["min_failures"] == 10, "the router to apply the thresholds")
    status, refused = await rig.request("PUT", "/api/settings/alerts", {"reach_threshold": 1.5})
    assert status == 400 and refused["field"] == "reach_threshold"


async def test_debug_sends_a_frame_and_reports_route_and_timings(rig: Rig, start_agent):
    await echo_mesh(rig, start_agent, "a1")
    status, result = await rig.request("POST", "/api/debug", {"capability": "echo", "payload": {"text": "hi"},
                                                              "request_id": "dbg-1"})
    assert status == 200 and result["http_status"] == 200 and result["request_id"] == "dbg-1"
    assert result["frame"]["result"] == {"echo": {"text": "hi"}, "agent": "a1"}
    assert result["frame"]["route"]["instance"] == "a1" and result["headers"]["x-reach-policy"] == "least_load"
    assert result["elapsed_ms"] > 0 and result["trace_url"] == "/api/traces/dbg-1"
    status, result = await rig.request("POST", "/api/debug", raw=b"{not json")
    assert status == 200 and result["http_status"] == 400 and result["frame"]["error_code"] == "INVALID_FRAME"


async def test_a_mesh_part_that_is_down_shows_as_unreachable(start_console, rig: Rig):
    console = await start_console(refused_url(), rig.mesh.url)
    lonely = Rig(rig.mesh, console, rig.http)
    overview = await lonely.until("/api/overview", lambda o: o["registry"]["checked_at"], "a poll")
    assert not overview["registry"]["ok"] and "upstream_unreachable" not in overview["registry"]["error"]
    assert overview["router"]["ok"]
    status, body = await lonely.request("GET", "/api/policies")
    assert status == 502 and body["error"] == "upstream_unreachable"
    status, body = await lonely.request("GET", "/api/reach?hours=0")
    assert status == 400 and body["field"] == "hours"

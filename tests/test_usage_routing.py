"""Usage through the router with real agents on loopback: what a rest or ATP agent reports comes back to
the caller with its cost at the serving instance's prices, in the trace, the audit trail, ``GET /usage``
and ``/metrics``; a garbled report never fails the call."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from aiohttp import web

from agent_support import CallEndpoint
from recording_support import Received, RecordingServer, starting
from router_support import Mesh

PRICES = {"cost_per_call": 0.25, "cost_per_1k_input_tokens": 8.0, "cost_per_1k_output_tokens": 4.0}


class MeteredAgent(CallEndpoint, RecordingServer):
    """A rest agent answering ``{"ok": true, "usage": ...}`` with the token counts its payload asks for
    (``in``, ``out``), under OpenAI's names as an LLM-backed agent passing its model's usage through does."""

    protocol = "rest"

    def __init__(self, name: str):
        super().__init__(self._answer)
        self.name = name

    async def _answer(self, request: web.Request, received: Received) -> web.StreamResponse:
        asked = received.json()
        usage = {"prompt_tokens": asked["in"], "completion_tokens": asked["out"],
                 "total_tokens": asked["in"] + asked["out"]}
        return web.json_response({"ok": True, "usage": usage})


async def audited(start_mesh, tmp_path) -> Mesh:
    return await start_mesh(auth=True, router_settings={"audit_path": tmp_path / "audit.db"})


async def caller_key(mesh: Mesh, name: str = "caller") -> str:
    return (await mesh.new_client(["llm.*"], name=name))["api_key"]


async def test_a_rest_agents_openai_usage_is_answered_with_its_cost_and_kept_in_trace_and_audit(
        start_mesh, start_scripted, tmp_path):
    mesh = await audited(start_mesh, tmp_path)
    agent = await start_scripted("llm-1")
    agent.body = json.dumps({"text": "hi", "usage": {"prompt_tokens": 250, "completion_tokens": 500}}).encode()
    await mesh.add(agent, "llm.chat", **PRICES)
    key = await caller_key(mesh)

    answer = await mesh.call("llm.chat", {"q": "hello"}, headers={"X-API-Key": key}, request_id="u-1")
    assert answer.status == 200, answer.body
    assert answer.body["result"] == {"text": "hi", "usage": {"prompt_tokens": 250, "completion_tokens": 500}}
    assert answer.body["usage"] == {"input_tokens": 250, "output_tokens": 500, "cost": 0.25 + 2.0 + 2.0}

    call = (await mesh.get("/traces/u-1"))["call"]
    assert call["usage"] == answer.body["usage"]
    async with mesh.http.get(f"{mesh.url}/audit?request_id=u-1", headers=mesh.admin) as response:
        row = (await response.json())["entries"][0]
    assert (row["input_tokens"], row["output_tokens"], row["cost"]) == (250, 500, 4.25)


async def test_an_atp_agents_frame_usage_is_priced_at_the_instance_that_served(mesh, start_scripted):
    agent = await start_scripted("llm-atp", protocol="atp")
    agent.body = json.dumps({"status": "success", "result": 7,
                             "usage": {"input_tokens": 1000, "output_tokens": 250}}).encode()
    await mesh.add(agent, "llm.atp", cost_per_1k_input_tokens=0.5)
    answer = await mesh.call("llm.atp", None)
    assert answer.status == 200, answer.body
    assert (answer.body["result"], answer.body["usage"]) == (7, {"input_tokens": 1000, "output_tokens": 250,
                                                                 "cost": 0.5})


async def test_without_prices_the_usage_is_answered_without_cost_and_without_either_nothing_is(mesh,
                                                                                              start_scripted):
    agent = await start_scripted("plain")
    await mesh.add(agent, "llm.plain")
    agent.body = b'{"usage": {"input_tokens": 3}}'
    assert (await mesh.call("llm.plain")).body["usage"] == {"input_tokens": 3, "output_tokens": 0, "cost": None}
    agent.body = b'{"answer": 1}'
    answer = await mesh.call("llm.plain")
    assert answer.status == 200 and "usage" not in answer.body
    assert [p["total"]["calls"] for p in (await mesh.get("/usage?capability=llm.plain"))["periods"]] == [1]


async def test_a_price_per_call_is_due_without_any_usage(mesh, start_scripted):
    agent = await start_scripted("flat")
    agent.body = b'{"answer": 1}'
    await mesh.add(agent, "llm.flat", cost_per_call=0.125)
    answer = await mesh.call("llm.flat")
    assert answer.body["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost": 0.125}


GARBAGE = [
    ("rest", b'{"answer": 1, "usage": "lots"}'),
    ("rest", b'{"answer": 1, "usage": {"input_tokens": -5, "output_tokens": 2}}'),
    ("rest", b'{"answer": 1, "usage": {"prompt_tokens": "9"}}'),
    ("rest", b'{"answer": 1, "usage": {"input_tokens": 1e400}}'),
    ("rest", b'{"answer": 1, "usage": {"output_tokens": 99999999999999999999999}}'),
    ("rest", b'[{"usage": {"input_tokens": 1}}]'),
    ("rest", b'"the word \\"usage\\" in a string"'),
    ("atp", b'{"status": "success", "result": {"answer": 1}, "usage": [1, 2]}'),
    ("atp", b'{"status": "success", "result": {"answer": 1}, "usage": {"input_tokens": true}}'),
]


@pytest.mark.parametrize(("protocol", "body"), GARBAGE, ids=[body.decode()[:60] for _, body in GARBAGE])
async def test_an_agent_answering_garbage_usage_never_fails_the_call(mesh, start_scripted, protocol, body):
    agent = await start_scripted("sloppy", protocol=protocol)
    agent.body = body
    await mesh.add(agent, "llm.sloppy", cost_per_call=0.5)
    answer = await mesh.call("llm.sloppy")
    assert answer.status == 200, answer.body
    sent = json.loads(body)
    assert answer.body["result"] == (sent["result"] if protocol == "atp" else sent)
    assert answer.body["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost": 0.5}  # the price, no tokens


async def test_usage_and_cost_sum_exactly_per_client_across_a_thousand_calls(start_mesh, tmp_path):
    mesh = await audited(start_mesh, tmp_path)
    async with starting(MeteredAgent) as start:
        agents = [await start("llm-a"), await start("llm-b")]
        for agent in agents:
            await mesh.add(agent, "llm.chat", **PRICES)
        keys = {name: await caller_key(mesh, name) for name in ("desk", "batch", "mobile")}
        clients = {name: mesh.router.mirror.auth.client_by_api_key(key).client_id for name, key in keys.items()}
        expected: dict[str, dict[str, Any]] = {name: {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost": 0.0}
                                               for name in keys}
        # Token counts priced to binary fractions: every cost and every sum of them is exact in a float.
        plan = [(list(keys)[i % 3], 125 * (i % 7), 250 * (i % 5)) for i in range(1000)]
        for name, tokens_in, tokens_out in plan:
            totals = expected[name]
            totals["calls"] += 1
            totals["input_tokens"] += tokens_in
            totals["output_tokens"] += tokens_out
            totals["cost"] += 0.25 + tokens_in // 125 + tokens_out // 250

        async def one(name: str, tokens_in: int, tokens_out: int) -> None:
            answer = await mesh.call("llm.chat", {"in": tokens_in, "out": tokens_out},
                                     headers={"X-API-Key": keys[name]})
            assert answer.status == 200, answer.body
            assert answer.body["usage"] == {"input_tokens": tokens_in, "output_tokens": tokens_out,
                                            "cost": 0.25 + tokens_in // 125 + tokens_out // 250}

        for first in range(0, len(plan), 50):
            await asyncio.gather(*(one(*step) for step in plan[first:first + 50]))

    for period in ("hour", "day"):
        periods = (await mesh.get(f"/usage?period={period}"))["periods"]
        by_client: dict[str, dict[str, Any]] = {}
        for summary in periods:  # the calls may straddle an hour's end
            for client_id, totals in summary["by_client"].items():
                mine = by_client.setdefault(client_id, dict.fromkeys(totals, 0))
                for field, value in totals.items():
                    mine[field] += value
        assert by_client == {clients[name]: totals for name, totals in expected.items()}
        instances = {agent_id for summary in periods for agent_id in summary["by_instance"]}
        assert instances == {"llm-a", "llm-b"}
    one_client = (await mesh.get(f"/usage?period=day&client={clients['desk']}"))["periods"]
    assert [(p["total"], list(p["by_client"])) for p in one_client] == [(expected["desk"], [clients["desk"]])]
    assert (await mesh.get("/usage?period=day&capability=llm.other"))["periods"] == []

    exposition = await mesh.get("/metrics")
    total_in = sum(totals["input_tokens"] for totals in expected.values())
    total_cost = sum(totals["cost"] for totals in expected.values())
    assert re.search(rf'^agentreach_tokens_total{{capability="llm.chat",direction="input"}} {total_in}\.0$',
                     exposition, re.MULTILINE)
    assert re.search(rf'^agentreach_cost_total{{capability="llm.chat"}} {total_cost}$', exposition, re.MULTILINE)
    assert 'client' not in " ".join(line for line in exposition.splitlines() if line.startswith("agentreach_tokens"))


async def test_usage_is_for_operators_and_refuses_an_unknown_period(start_mesh, tmp_path):
    mesh = await audited(start_mesh, tmp_path)
    async with mesh.http.get(f"{mesh.url}/usage") as response:
        assert response.status == 401
    async with mesh.http.get(f"{mesh.url}/usage?period=week", headers=mesh.admin) as response:
        body = await response.json()
        assert (response.status, body["error"], body["field"]) == (400, "invalid_field", "period")
        assert body["message"]


async def test_a_fallbacks_answer_is_priced_at_its_own_instance_and_a_fixed_answer_costs_nothing(mesh,
                                                                                                start_scripted):
    down, backup = await start_scripted("main-1"), await start_scripted("backup-1")
    down.status, down.body = 500, b'{"usage": {"input_tokens": 1000}}'
    backup.body = b'{"answer": "from backup", "usage": {"output_tokens": 500}}'
    await mesh.add(down, "llm.main", cost_per_call=100.0, cost_per_1k_input_tokens=100.0)
    await mesh.add(backup, "llm.backup", cost_per_1k_output_tokens=2.0)
    await mesh.put_policy("llm.main", {"fallback_capability": "llm.backup"})
    answer = await mesh.call("llm.main")
    assert (answer.status, answer.route["capability"], answer.route["reason"]) == (200, "llm.backup", "fallback")
    assert answer.body["usage"] == {"input_tokens": 0, "output_tokens": 500, "cost": 1.0}
    (day,) = (await mesh.get("/usage?period=day"))["periods"]
    assert (list(day["by_capability"]), list(day["by_instance"])) == (["llm.backup"], ["backup-1"])

    await mesh.put_policy("llm.main", {"degradation": {"level": "L2", "answer": "sorry"}})
    floor = await mesh.call("llm.main")
    assert (floor.status, floor.body["result"], floor.route["reason"]) == (200, "sorry", "fixed_answer")
    assert "usage" not in floor.body  # nobody answered: the failed instance's price is not due

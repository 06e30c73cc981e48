"""A2A attacked: an A2A agent answering JSON nested past any need is that agent's malformed answer (never the
router's failure), a card's version is the newest instance's in semantic order, and a message to the
catalog that names no capability is refused without reaching anything, and the tasks kept stay within bounds."""

from __future__ import annotations

import msgspec
import pytest
from aiohttp import web

from router.a2a.tasks import TaskBook, TaskEntry
from router_support import capability

NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
async def nesting_agent():
    """An A2A agent whose card is honest and whose every answer nests 100,000 levels deep."""
    async def card(request: web.Request) -> web.Response:
        rpc_url = f"http://127.0.0.1:{request.url.port}/rpc"
        return web.json_response({"name": "deep", "supportedInterfaces": [
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]})

    async def rpc(request: web.Request) -> web.Response:
        return web.Response(body=b'{"jsonrpc": "2.0", "id": 1, "result": ' + NESTED + b"}",
                            content_type="application/json")

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_post("/rpc", rpc)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/.well-known/agent-card.json"
    await runner.cleanup()


async def test_an_answer_nested_too_deep_is_the_agents_malformed_answer(mesh, nesting_agent):
    await mesh.register("deep-1", [capability("deep", nesting_agent, "a2a")])
    await mesh.heartbeat("deep-1")
    await mesh.until_state("deep-1")
    answer = await mesh.call("deep", "x")
    assert answer.body["error_code"] == "AGENT_ERROR" and "malformed" in answer.body["error_message"], answer.body


async def test_a_card_shows_the_newest_version_in_semantic_order(mesh, http, start_agent):
    agent = await start_agent("v-1")
    for agent_id, version in (("v-9", "9.0.0"), ("v-10", "10.0.0"), ("v-x", "not-a-version")):
        await mesh.register(agent_id, [capability("versioned", agent.endpoint, version=version)], service="versioned")
    async with http.get(f"{mesh.url}/a2a/versioned/.well-known/agent-card.json") as answer:
        assert (await answer.json())["version"] == "10.0.0"


async def test_a_catalog_message_naming_no_capability_is_refused(mesh, http, start_agent):
    await mesh.add(await start_agent("cat-1"), "cat.echo")
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m", "parts": [{"text": "which capability is this for?"}]}}}
    async with http.post(f"{mesh.url}/a2a", json=body) as answer:
        error = (await answer.json())["error"]
    assert (answer.status, error["code"], error["data"][0]["reason"]) == (200, -32602, "INVALID_FRAME")
    assert "capability is required" in error["message"]


def finished(book: TaskBook, task_id: str, result: bytes = b"1") -> TaskEntry:
    entry = book.open(TaskEntry(id=task_id, context_id="c", capability="cap", owner="client-1"))
    entry.result = msgspec.Raw(result)
    book.finish(entry)
    return entry


def test_finished_tasks_are_kept_within_their_count_and_bytes_and_only_for_their_owner():
    book = TaskBook(max_tasks=2, max_result_bytes=10)
    for task_id in ("t1", "t2", "t3"):
        finished(book, task_id)
    assert [book.find(task_id, "client-1") is not None for task_id in ("t1", "t2", "t3")] == [False, True, True]
    assert book.find("t3", "client-2") is None and book.find("t3", None) is None
    finished(book, "big", b"x" * 9)  # 1 + 9 bytes fit; t2's go with the oldest
    assert [book.find(task_id, "client-1") is not None for task_id in ("t2", "t3", "big")] == [False, True, True]
    working = book.open(TaskEntry(id="live", context_id="c", capability="cap", owner="client-1"))
    for n in range(5):
        finished(book, f"more-{n}")
    assert book.find("live", "client-1") is working  # a task in flight is never dropped


def test_finished_tasks_go_once_kept_long_enough():
    book = TaskBook(keep_s=0.0)
    finished(book, "t1")
    assert book.find("t1", "client-1") is None

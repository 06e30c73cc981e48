"""JSON a peer sends nested past the mesh's limit (agent_reach.peer_json) is malformed input, whoever sent it:
an A2A agent's card (failed over before anything is sent, or AGENT_ERROR naming the card), an agent's answer
(AGENT_ERROR), a caller's body (400), a watch-feed line or an etcd value (their malformed-input paths). Real
routers, registries, agents, etcd and stand-ins on 127.0.0.1; and the helper itself at its limit."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from agent_reach import ReachClient, peer_json
from agent_reach.peer_json import MAX_DEPTH, MAX_PASSED_DEPTH, TooDeep
from aiohttp import web

from agent_support import answered
from conftest import wait_for
from etcd_support import EtcdCluster
from recording_support import Received, RecordingServer, starting
from registry.etcd_cluster import EtcdMembership, cluster_prefix
from registry.etcd_http import b64
from registry.server import RegistryServer
from router.feed import follow_http
from router.mirror import RegistryMirror
from router_support import capability
from sdk_support import post_frame

DEEP = b"[" * 100_000 + b"]" * 100_000


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def value(depth: int) -> Any:
    return msgspec.json.decode(nested(depth))


# The helper.

def test_the_limit_is_reached_but_not_passed() -> None:
    assert peer_json.decode(nested(MAX_DEPTH)) == value(MAX_DEPTH)
    with pytest.raises(TooDeep, match=f"exceeds the limit of {MAX_DEPTH} levels"):
        peer_json.decode(nested(MAX_DEPTH + 1))
    objects = b'{"a": ' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH
    assert peer_json.depth_exceeds(objects) is False
    assert peer_json.depth_exceeds(b"[" + objects + b"]") is True
    assert peer_json.depth_exceeds(nested(MAX_DEPTH + 1).decode()) is True  # text as well as bytes


def test_brackets_in_strings_and_escapes_are_no_nesting() -> None:
    strings = b'["' + b"[" * 200 + b'\\"' + b"{" * 200 + b'", "\\\\", "' + b"[" * 200 + b'"]'
    assert peer_json.decode(strings)[1] == "\\"
    # An escaped backslash ends its string's escapes: the brackets after the closing quote are nesting.
    assert peer_json.depth_exceeds(b'["\\\\", ' + nested(MAX_DEPTH) + b"]") is True
    assert peer_json.depth_exceeds(b'["\\\\\\"' + b"[" * 200 + b'"]') is False


def test_a_wide_shallow_body_and_an_unbalanced_one() -> None:
    wide = msgspec.json.encode([{"k": [i, {"v": [i]}]} for i in range(10_000)])
    assert peer_json.depth_exceeds(wide) is False
    assert peer_json.depth_exceeds(b"[" * (MAX_DEPTH + 1)) is True
    with pytest.raises(msgspec.DecodeError):  # what every malformed-input path already catches
        peer_json.Decoder(list[Any]).decode(DEEP)


# A2A agents: cards and answers.

class A2AStandIn(RecordingServer):
    """An A2A agent whose card (``card`` members merged into an honest one) and whose answer's data part
    (``data``, raw JSON) a test sets."""

    def __init__(self) -> None:
        super().__init__(self._reply)
        self.card = b""
        self.data = b'"ok"'

    @property
    def card_url(self) -> str:
        return f"{self.url}/card"

    async def _reply(self, request: web.Request, received: Received) -> web.Response:
        if received.path == "/card":
            honest = b'{"name": "a2a", "supportedInterfaces": [{"url": "%s/rpc", "protocolBinding": "JSONRPC", ' \
                     b'"protocolVersion": "1.0"}]' % self.url.encode()
            return web.Response(body=honest + self.card + b"}", content_type="application/json")
        body = b'{"jsonrpc": "2.0", "id": 1, "result": {"message": {"parts": [{"data": ' + self.data + b"}]}}}"
        return web.Response(body=body, content_type="application/json")


@pytest.fixture
async def start_a2a() -> AsyncIterator[Callable[[], Awaitable[A2AStandIn]]]:
    async with starting(A2AStandIn) as start:
        yield start


async def add_a2a(mesh: Any, agent_id: str, agent: A2AStandIn, load: float = 0.0) -> None:
    await mesh.register(agent_id, [capability("cardy", agent.card_url, "a2a")], service="cardy")
    await mesh.heartbeat(agent_id, load=load)
    await mesh.until_state(agent_id)


def no_traceback(router_logs: Any) -> None:
    assert [line for line in router_logs.lines if "exception" in line] == []


async def test_a_deep_card_fails_over_to_a_healthy_instance(mesh, start_a2a, router_logs) -> None:
    deep, good = await start_a2a(), await start_a2a()
    deep.card = b', "extensions": ' + DEEP  # ~200 KB: within the card size cap
    await add_a2a(mesh, "deep-card-1", deep)
    await add_a2a(mesh, "good-card-1", good, load=0.9)  # the deep one is the first choice

    async def tried_the_deep_card() -> list[Received]:
        answer = await mesh.call("cardy", "hi")
        assert (answer.status, answer.body.get("result"), answer.route["instance"]) == (200, "ok", "good-card-1"), \
            answer.body
        return deep.at("/card")

    await wait_for(tried_the_deep_card, what="a call that read the deep card first")
    assert deep.at("/rpc") == [], "nothing is sent to an agent whose card is unreadable"
    failed = [line for line in router_logs.named("attempt failed") if line["instance"] == "deep-card-1"]
    assert failed and all("nesting" in line["error"] for line in failed)
    no_traceback(router_logs)


async def test_a_deep_card_alone_is_an_agent_error_naming_the_card(mesh, start_a2a, router_logs) -> None:
    deep = await start_a2a()
    deep.card = b', "skills": [{"id": "s", "examples": ' + DEEP + b"}]"
    await add_a2a(mesh, "deep-card-1", deep)
    answer = await mesh.call("cardy", "hi")
    assert (answer.status, answer.body["error_code"]) == (502, "AGENT_ERROR"), answer.body
    assert "card" in answer.body["error_message"] and "nesting" in answer.body["error_message"]
    request_id = answer.body["request_id"]
    assert len([line for line in router_logs.named("attempt failed") if line.get("request_id") == request_id]) == 1
    no_traceback(router_logs)


async def test_an_a2a_answer_nested_past_the_limit_is_an_agent_error(mesh, start_a2a) -> None:
    agent = await start_a2a()
    agent.data = nested(MAX_DEPTH)  # decodable by msgspec, but past what the router takes in to pass on
    await add_a2a(mesh, "deep-answer-1", agent)
    answer = await mesh.call("cardy", "hi")
    assert answer.body["error_code"] == "AGENT_ERROR" and "nesting" in answer.body["error_message"], answer.body


# Agents' answers, rest and ATP.

@pytest.mark.parametrize(("protocol", "body"), [
    ("rest", nested(MAX_PASSED_DEPTH + 1)),
    ("rest", b'{"text": "hi", "usage": ' + nested(MAX_PASSED_DEPTH) + b"}"),
    ("atp", b'{"request_id": "r", "status": "success", "result": ' + nested(MAX_PASSED_DEPTH) + b"}"),
    ("atp", b'{"request_id": "r", "status": "success", "result": 1, "context_update": {"a": '
     + nested(MAX_PASSED_DEPTH) + b"}}"),
])
async def test_an_answer_past_the_limit_is_the_agents_malformed_answer(mesh, start_scripted, protocol, body) -> None:
    answer = await answered(mesh, start_scripted, "deep.cap", body, protocol)
    assert (answer.status, answer.body["error_code"]) == (502, "AGENT_ERROR"), answer.body
    assert "malformed" in answer.body["error_message"] and "nesting" in answer.body["error_message"]


async def test_an_answer_at_the_limit_reaches_an_sdk_caller_in_the_routers_frame(mesh, start_scripted) -> None:
    """The router's frame (and any envelope) adds levels to what it passed on: the SDK still reads it."""
    agent = await start_scripted("deep-ok-1")
    agent.body = nested(MAX_PASSED_DEPTH)
    await mesh.add(agent, "deep.ok")
    async with ReachClient(mesh.url) as client:
        assert await client.call("deep.ok", {"q": 1}) == value(MAX_PASSED_DEPTH)
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "atp.call", "params": {"capability": "deep.ok", "payload": 1}}
    answer = await mesh.post(rpc)
    assert answer.body["result"]["result"] == value(MAX_PASSED_DEPTH), answer.body


# Callers' bodies: the registry's and an SDK agent's.

async def test_a_policy_past_the_limit_is_refused_naming_it(registry, http) -> None:
    """A floor answer is passed on in every router's watch feed, deeper by its envelope: refused at the edge."""
    body = b'{"degradation": {"answer": ' + nested(MAX_PASSED_DEPTH) + b"}}"
    async with http.put(f"{registry.url}/policies/deep.policy", data=body,
                        headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        error = await response.json()
    assert error["error"] == "invalid_json" and "nesting" in error["message"], error
    async with http.get(f"{registry.url}/policies/deep.policy") as response:
        assert response.status == 404
    shallow = {"degradation": {"answer": value(40)}}
    async with http.put(f"{registry.url}/policies/deep.policy", json=shallow) as response:
        assert response.status == 200, await response.text()


async def test_a_frame_past_the_limit_is_refused_by_an_sdk_agent(registry, make_agent, http) -> None:
    agent = make_agent("deep-frame-1", registry.url)

    @agent.capability("test.deep")
    async def echo(payload: Any, ctx: Any) -> Any:
        return payload

    await agent.start()
    endpoint = f"{agent.base_url}/atp/test.deep"
    frame = b'{"request_id": "r-1", "capability": "test.deep", "payload": ' + DEEP + b"}"
    status, answer = await post_frame(http, endpoint, frame, {"X-Request-Id": "r-1"})
    assert (status, answer["error_code"]) == (400, "INVALID_FRAME") and "nesting" in answer["error_message"], answer


# The watch feed and etcd.

async def test_a_deep_watch_line_is_a_malformed_line_the_follower_survives(router_logs) -> None:
    async def feed(request: web.Request, received: Received) -> web.Response:
        line = b'{"type": "put", "revision": 1, "key": "policies/p", "value": ' + DEEP + b"}\n"
        return web.Response(body=line, content_type="application/x-ndjson")

    async with starting(RecordingServer) as start, aiohttp.ClientSession() as session:
        registry = await start(feed)
        following = asyncio.ensure_future(follow_http(session, registry.url, RegistryMirror()))
        try:
            await wait_for(lambda: len(registry.at("/watch")) >= 2 or following.done(),
                           what="the follower to reconnect after the deep line")
            assert not following.done(), following.exception()
        finally:
            following.cancel()
    interrupted = router_logs.named("registry watch interrupted; routing on the last view")
    assert interrupted and "nesting" in interrupted[0]["error"]


async def test_a_deep_node_entry_in_etcd_is_skipped_like_any_unreadable_one(etcd_cluster, etcd_registry, tmp_path: Path,
                                                                          http: aiohttp.ClientSession) -> None:
    cluster: EtcdCluster = await etcd_cluster()
    junk = cluster_prefix(f"/{tmp_path.name}/") + "nodes/deep"
    entry = base64.b64encode(b'{"node_id": "deep", "url": "http://127.0.0.1:9", "extra": ' + DEEP + b"}").decode()
    async with http.post(f"{cluster.endpoints[0]}/v3/kv/put", json={"key": b64(junk), "value": entry}) as response:
        assert response.status == 200
    node: RegistryServer = await etcd_registry(cluster, node_ttl=2, cluster_poll=0.2, gossip_interval=0.2)
    membership = node.membership
    assert isinstance(membership, EtcdMembership)
    await wait_for(membership.leads, timeout=10, what="the node to lead despite the deep entry")
    async with http.get(f"{node.url}/cluster") as response:
        assert [entry["url"] for entry in (await response.json())["nodes"]] == [node.url]

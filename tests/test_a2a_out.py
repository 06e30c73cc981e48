"""The mesh as A2A agents, called by the official a2a-sdk client through the real router over real HTTP:
a capability's Agent Card, SendMessage and SendStreamingMessage turned into ATP calls, tasks/get and
tasks/cancel, the v0.3 method names, and bad JSON-RPC answered as JSON-RPC errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from a2a.client import A2AClientError, ClientConfig, ClientFactory
from a2a.types import CancelTaskRequest, GetTaskRequest, TaskState
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from a2a_support import a2a_client, card_at, data, events, message, text, values
from conftest import wait_for


async def echo_agent(mesh, make_agent, agent_id="a2a-echo-1"):
    """An SDK agent serving text.echo (its payload and what it learned of the context back)."""
    agent = make_agent(agent_id, mesh.registry.url)

    @agent.capability("text.echo", version="2.1", description="Says back what it is given",
                      examples=["echo hello", "repeat this"])
    async def echo(payload, ctx):
        return {"echo": payload, "session": ctx.session_id, "tenant": ctx.context.get("tenant")}

    await agent.start()
    await mesh.until_state(agent_id)


async def counting_agent(mesh, make_agent, gate: asyncio.Event | None = None, agent_id="a2a-count-1"):
    """An SDK agent streaming 0..payload-1, one chunk each; with ``gate``, it holds after its first chunk."""
    agent = make_agent(agent_id, mesh.registry.url)
    left = asyncio.Event()

    @agent.capability("text.count", timeout_sla_ms=10_000)
    async def count(payload, ctx):
        try:
            for n in range(int(payload)):  # a protobuf Value: numbers arrive as 3.0
                yield n
                if gate is not None:
                    await gate.wait()
        except asyncio.CancelledError:
            left.set()
            raise

    await agent.start()
    await mesh.until_state(agent_id)
    return left


async def test_the_client_discovers_a_capability_from_its_card(mesh, make_agent):
    await echo_agent(mesh, make_agent)
    card = await card_at(f"{mesh.url}/a2a/text.echo")
    assert (card.name, card.version, card.description) == ("text.echo", "2.1", "Says back what it is given")
    interface = card.supported_interfaces[0]
    assert (interface.url, interface.protocol_binding, interface.protocol_version) == \
        (f"{mesh.url}/a2a/text.echo", "JSONRPC", "1.0")
    assert card.capabilities.streaming and not card.security_schemes
    assert [(s.id, list(s.examples)) for s in card.skills] == [("text.echo", ["echo hello", "repeat this"])]


async def test_send_message_is_an_atp_call_and_its_answer_a_completed_task(mesh, make_agent):
    await echo_agent(mesh, make_agent)
    async with a2a_client(f"{mesh.url}/a2a/text.echo") as client:
        [answer] = await events(client, message(text("hello"), metadata={"context": {"tenant": "t1"}},
                                                context_id="conversation-7"))
    task = answer.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED and task.context_id == "conversation-7"
    [artifact] = task.artifacts
    # The text part is the payload; the A2A contextId the session; metadata.context the ATP context.
    assert values(artifact.parts) == [{"echo": "hello", "session": "conversation-7", "tenant": "t1"}]
    facts = task.metadata["agentreach"]
    assert facts["request_id"] == task.id and facts["route"]["instance"] == "a2a-echo-1"
    trace = (await mesh.get(f"/traces/{task.id}"))["call"]
    assert trace["outcome"] == "success"


async def test_a_data_part_is_the_payload_itself(mesh, make_agent):
    await echo_agent(mesh, make_agent)
    async with a2a_client(f"{mesh.url}/a2a/text.echo") as client:
        [answer] = await events(client, message(data({"n": [1, 2]})))
        [mixed] = await events(client, message(text("a"), data(3)))
    assert values(answer.task.artifacts[0].parts)[0]["echo"] == {"n": [1, 2]}
    assert values(mixed.task.artifacts[0].parts)[0]["echo"] == {"text": "a", "data": [3]}


async def test_streaming_sends_each_chunk_as_an_artifact_update_then_the_result(mesh, make_agent):
    await counting_agent(mesh, make_agent)
    async with a2a_client(f"{mesh.url}/a2a/text.count", streaming=True) as client:
        streamed = await events(client, message(data(3)))
    kinds = [event.WhichOneof("payload") for event in streamed]
    assert kinds == ["task", "artifact_update", "artifact_update", "artifact_update", "artifact_update",
                     "status_update"]
    assert streamed[0].task.status.state == TaskState.TASK_STATE_WORKING
    chunks = [event.artifact_update for event in streamed[1:4]]
    assert [(u.artifact.artifact_id, u.append, values(u.artifact.parts)) for u in chunks] == \
        [("stream", False, [0]), ("stream", True, [1]), ("stream", True, [2])]
    result = streamed[4].artifact_update
    assert (result.artifact.artifact_id, result.last_chunk, values(result.artifact.parts)) == ("result", True, [2])
    assert streamed[5].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    trace = (await mesh.get(f"/traces/{streamed[0].task.id}"))["call"]
    assert (trace["streamed"], trace["chunks"]) == (True, 3)


async def test_streaming_an_answer_without_chunks_opens_working_then_completes(mesh, make_agent):
    await echo_agent(mesh, make_agent)
    async with a2a_client(f"{mesh.url}/a2a/text.echo", streaming=True) as client:
        streamed = await events(client, message(text("once")))
    assert [event.WhichOneof("payload") for event in streamed] == ["task", "artifact_update", "status_update"]
    assert streamed[0].task.status.state == TaskState.TASK_STATE_WORKING and not streamed[0].task.artifacts
    assert values(streamed[1].artifact_update.artifact.parts)[0]["echo"] == "once"
    assert streamed[2].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_tasks_get_and_cancel_reach_a_task_in_flight(mesh, make_agent):
    gate = asyncio.Event()
    left = await counting_agent(mesh, make_agent, gate)
    async with a2a_client(f"{mesh.url}/a2a/text.count", streaming=True) as client:
        stream = client.send_message(message(data(5)))
        opened = await anext(stream)
        task_id = opened.task.id
        first_chunk = await anext(stream)
        assert values(first_chunk.artifact_update.artifact.parts) == [0]
        working = await client.get_task(GetTaskRequest(id=task_id))
        assert working.status.state == TaskState.TASK_STATE_WORKING
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        rest = [event async for event in stream]
        assert rest[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
        await asyncio.wait_for(left.wait(), 1)  # the agent's handler is cancelled within a second
        later = await client.get_task(GetTaskRequest(id=task_id))
        assert later.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="has ended"):
            await client.cancel_task(CancelTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError, match="No task"):
            await client.get_task(GetTaskRequest(id="no-such-task"))


async def test_return_immediately_answers_a_working_task_to_poll(mesh, make_agent):
    await echo_agent(mesh, make_agent)
    async with a2a_client(f"{mesh.url}/a2a/text.echo", polling=True) as client:
        [answer] = await events(client, message(text("later")))
        assert answer.task.status.state == TaskState.TASK_STATE_WORKING

        async def done():
            task = await client.get_task(GetTaskRequest(id=answer.task.id))
            return task if task.status.state == TaskState.TASK_STATE_COMPLETED else None

        task = await wait_for(done, what="the task to complete")
    assert values(task.artifacts[0].parts)[0]["echo"] == "later"


async def test_an_agent_failure_is_a_failed_task_with_its_atp_code(mesh, make_agent):
    agent = make_agent("a2a-fail-1", mesh.registry.url)

    @agent.capability("text.fail")
    async def fail(payload, ctx):
        raise RuntimeError("broken")

    await agent.start()
    await mesh.until_state("a2a-fail-1")
    async with a2a_client(f"{mesh.url}/a2a/text.fail") as client:
        [answer] = await events(client, message(text("x")))
    assert answer.task.status.state == TaskState.TASK_STATE_FAILED
    assert answer.task.metadata["agentreach"]["error_code"] == "AGENT_ERROR"
    assert values(answer.task.status.message.parts)


async def test_the_v03_method_names_answer_in_v03_shapes(mesh, make_agent, http):
    await echo_agent(mesh, make_agent)
    body = {"jsonrpc": "2.0", "id": 7, "method": "message/send",
            "params": {"message": {"kind": "message", "messageId": "m1", "role": "user",
                                   "parts": [{"kind": "text", "text": "old"}]}}}
    async with http.post(f"{mesh.url}/a2a/text.echo", json=body) as answer:
        reply = await answer.json()
    task = reply["result"]
    assert reply["id"] == 7 and task["kind"] == "task" and task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"][0] == {"kind": "data", "data": {"echo": "old", "session": task["contextId"],
                                                                         "tenant": None}}
    ref = {"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"id": task["id"]}}
    async with http.post(f"{mesh.url}/a2a/text.echo", json=ref) as answer:
        assert (await answer.json())["result"]["status"]["state"] == "completed"


@pytest.mark.parametrize(("body", "code", "field"), [
    (b"{not json", -32700, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     -32600, None),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "SendMessage"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope"}', -32601, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m"}}}', -32602,
     "params.message.parts"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", '
     b'"parts": [{"url": "http://127.0.0.1:9/f"}]}}}', -32005, None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m", '
     b'"parts": [{"text": "x"}]}, "metadata": {"context": 5}}}', -32602, "metadata.context"),
])
async def test_bad_json_rpc_is_answered_as_a_json_rpc_error(mesh, make_agent, http, body, code, field):
    await echo_agent(mesh, make_agent)
    async with http.post(f"{mesh.url}/a2a/text.echo", data=body) as answer:
        reply = await answer.json()
    assert answer.status == 200 and reply["error"]["code"] == code and reply["error"]["message"]
    if field is not None:
        assert reply["error"]["data"][0]["metadata"]["field"] == field
    async with a2a_client(f"{mesh.url}/a2a/text.echo") as client:  # still serving
        assert (await events(client, message(text("ok"))))[0].task.status.state == TaskState.TASK_STATE_COMPLETED


async def test_an_unknown_capability_has_no_card_and_its_calls_are_refused(mesh, http):
    async with http.get(f"{mesh.url}/a2a/nothing/.well-known/agent-card.json") as answer:
        assert answer.status == 404 and (await answer.json())["error"] == "unknown_capability"
    body = {"jsonrpc": "2.0", "id": "x", "method": "SendMessage",
            "params": {"message": {"messageId": "m", "parts": [{"text": "hi"}]}}}
    async with http.post(f"{mesh.url}/a2a/nothing", json=body) as answer:
        error = (await answer.json())["error"]
    assert error["code"] == -32000 and error["data"][0]["reason"] == "UNKNOWN_CAPABILITY"


async def test_credentials_are_checked_as_for_atp_and_refusals_are_json_rpc_errors(secure):
    mesh, _ = secure
    granted = await mesh.new_client(["echo"], trust_level="internal")
    other = await mesh.new_client(["other"], name="other")
    key = {"X-API-Key": granted["api_key"]}
    card = await card_at(f"{mesh.url}/a2a/echo", key)
    async with a2a_client(f"{mesh.url}/a2a/echo", headers=key) as client:
        [answer] = await events(client, message(data({"x": 1})))
    assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert set(card.security_schemes) == {"apiKey", "oauth2"}
    assert card.security_schemes["oauth2"].oauth2_security_scheme.flows.client_credentials.token_url == \
        f"{mesh.url}/oauth/token"
    for headers, reason in (({}, "UNAUTHENTICATED"), ({"X-API-Key": "wrong"}, "UNAUTHENTICATED"),
                            ({"X-API-Key": other["api_key"]}, "FORBIDDEN")):
        async with httpx.AsyncClient(headers=headers) as http:
            client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
            with pytest.raises(A2AClientError, match="JSON-RPC Error -32000"):
                await events(client, message(text("no")))
            refused = await http.post(f"{mesh.url}/a2a/echo", json={
                "jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                "params": {"message": {"messageId": "m", "parts": [{"text": "no"}]}}})
            assert refused.json()["error"]["data"][0]["reason"] == reason
        # Nobody sees a card it may not call: without a credential, 401; with another client's, 404.
        async with httpx.AsyncClient(headers=headers) as http:
            shown = await http.get(f"{mesh.url}/a2a/echo/.well-known/agent-card.json")
        assert shown.status_code == (404 if reason == "FORBIDDEN" else 401)
    async with a2a_client(f"{mesh.url}/a2a/echo", headers=key) as client:
        with pytest.raises(TaskNotFoundError, match="No task"):
            await client.get_task(GetTaskRequest(id=answer.task.id + "x"))
    # A task is its caller's: another client cannot read it.
    async with httpx.AsyncClient(headers={"X-API-Key": other["api_key"]}) as http:
        peek = await http.post(f"{mesh.url}/a2a/echo", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                                                             "params": {"id": answer.task.id}})
    assert peek.json()["error"]["code"] == -32001

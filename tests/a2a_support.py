"""The official a2a-sdk's client against the real router: building one, messages, and reading its answers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.client import Client
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_task
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette


@contextlib.asynccontextmanager
async def a2a_client(url: str, *, streaming: bool = False, headers: dict[str, str] | None = None,
                     polling: bool = False) -> AsyncIterator[Client]:
    """An a2a-sdk client for the agent whose card is at ``{url}/.well-known/agent-card.json``."""
    async with httpx.AsyncClient(headers=headers or {}, timeout=30) as http:
        client = await create_client(url, client_config=ClientConfig(streaming=streaming, polling=polling,
                                                                     httpx_client=http))
        try:
            yield client
        finally:
            await client.close()


async def card_at(url: str, headers: dict[str, str] | None = None) -> AgentCard:
    """The card the a2a-sdk's resolver reads at ``{url}/.well-known/agent-card.json``."""
    async with httpx.AsyncClient(headers=headers or {}) as http:
        return await A2ACardResolver(http, url).get_agent_card()


def message(*parts: Part, metadata: dict[str, Any] | None = None, context_id: str = "") -> SendMessageRequest:
    request = SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts,
                                                 context_id=context_id))
    if metadata is not None:
        request.metadata.update(metadata)
    return request


def text(value: str) -> Part:
    return Part(text=value)


def data(value: Any) -> Part:
    return Part(data=ParseDict(value, Value()))


async def events(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [event async for event in client.send_message(request)]


def values(parts: Any) -> list[Any]:
    """What parts hold: texts as strings, data as JSON values."""
    return [*get_text_parts(parts), *get_data_parts(parts)]


class ScriptedExecutor(AgentExecutor):
    """An a2a-sdk agent whose first part says what to do: ``{"count": n}`` streams n artifact updates,
    ``"fail"`` fails, ``"ask"`` asks for input, ``"hold"`` sends one chunk and works until cancelled, anything
    else is echoed. ``seen`` keeps each request's values and metadata; ``cancelled`` is set by a cancellation."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[Any], dict[str, Any]]] = []
        self.cancelled = asyncio.Event()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        said = values(context.message.parts)
        self.seen.append((said, dict(context.metadata)))
        await event_queue.enqueue_event(new_task(context.task_id, context.context_id, TaskState.TASK_STATE_WORKING))
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        command = said[0]
        if isinstance(command, dict) and "count" in command:
            for n in range(int(command["count"])):
                await updater.add_artifact([data(n)], artifact_id="count", append=n > 0)
            await updater.complete()
        elif command == "fail":
            await updater.failed(updater.new_agent_message([text("it broke")]))
        elif command == "ask":
            await updater.requires_input(updater.new_agent_message([text("which one?")]))
        elif command == "hold":
            await updater.add_artifact([text("started")], artifact_id="progress")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        else:
            await updater.add_artifact([text(f"echo: {command}")], artifact_id="answer")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.cancelled.set()


def a2a_app(executor: AgentExecutor, port: int, name: str = "scripted") -> Starlette:
    """A Starlette app serving ``executor`` as the a2a-sdk serves agents: its card and JSON-RPC at /rpc."""
    interface = AgentInterface(url=f"http://127.0.0.1:{port}/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
    card = AgentCard(name=name, description="A scripted A2A agent", version="1.0.0", supported_interfaces=[interface],
                     capabilities=AgentCapabilities(streaming=True), default_input_modes=["text/plain"],
                     default_output_modes=["text/plain"],
                     skills=[AgentSkill(id="echo", name="echo", description="Echoes", tags=["echo"])])
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/rpc")])

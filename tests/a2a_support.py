"""The official a2a-sdk's client against the real router: building one, messages, and reading its answers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.client import Client
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts
from a2a.types import AgentCard, Message, Part, Role, SendMessageRequest, StreamResponse
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value


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

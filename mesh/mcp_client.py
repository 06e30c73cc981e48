"""The client side of MCP over Streamable HTTP, as the mesh needs it: begin a session, send one request, read
its answer (application/json, or the server-sent events of text/event-stream up to the answer's own event).

The router calls MCP servers' tools with it (router/transports/mcp.py), the registry pings them
(registry/health.py), and `agentreach mcp add` lists their tools. Nothing here follows a redirect.
"""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.sse import EVENT_STREAM, EventParser

PROTOCOL_VERSION = "2025-06-18"
SESSION_HEADER = "Mcp-Session-Id"
ACCEPT = f"application/json, {EVENT_STREAM}"
CLIENT_INFO = {"name": "agentreach", "version": "0.1.0"}
_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()


class McpFailure(Exception):
    """The server answered with a JSON-RPC error (``code``), or not as MCP at all (``code`` None); ``status``
    is the HTTP status (404: the session has ended)."""

    def __init__(self, message: str, code: int | None = None, status: int = 200):
        super().__init__(message)
        self.code, self.status = code, status


def _headers(session_id: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": PROTOCOL_VERSION}
    if session_id is not None:
        headers[SESSION_HEADER] = session_id
    return headers


def _decoded(data: bytes) -> Any:
    try:
        return peer_json.decode(data)
    except ValueError:
        raise McpFailure("the MCP server answered something that is not JSON") from None


def _outcome(message: Any, rpc_id: int) -> Any | None:
    """The result of the answer to ``rpc_id``; None when ``message`` is another (a notification)."""
    if not isinstance(message, dict) or message.get("id") != rpc_id:
        return None
    error = message.get("error")
    if isinstance(error, dict):
        raise McpFailure(str(error.get("message", "")), error.get("code") if isinstance(error.get("code"), int)
                         else None)
    if not isinstance(message.get("result"), dict):
        raise McpFailure("the MCP server's answer has no result object")
    return message["result"]


async def request(http: aiohttp.ClientSession, url: str, session_id: str | None, method: str,
                  params: dict[str, Any], timeout: aiohttp.ClientTimeout, max_bytes: int = 16 * 1024 * 1024,
                  ) -> tuple[dict[str, Any], str | None]:
    """Send one request; its result and the session id the server named (``initialize`` begins one)."""
    rpc_id = next(_ids)
    body = _encoder.encode({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
    async with http.post(url, data=body, headers=_headers(session_id), timeout=timeout,
                         allow_redirects=False) as response:
        named = response.headers.get(SESSION_HEADER, session_id)
        if response.status // 100 != 2:
            raise McpFailure(f"the MCP server answered HTTP {response.status}", status=response.status)
        if response.content_type != EVENT_STREAM:
            result = _outcome(_decoded(await response.content.read(max_bytes + 1)), rpc_id)
            if result is None:
                raise McpFailure("the MCP server answered another request's id")
            return result, named
        parser, size = EventParser(), 0
        async for received in response.content.iter_any():
            size += len(received)
            if size > max_bytes:
                raise McpFailure(f"the MCP server's answer exceeds {max_bytes} bytes")
            for event in parser.feed(received):
                if event.data and (result := _outcome(_decoded(event.data), rpc_id)) is not None:
                    return result, named
    raise McpFailure("the MCP server's stream ended without an answer")


async def notify(http: aiohttp.ClientSession, url: str, session_id: str | None, method: str,
                 timeout: aiohttp.ClientTimeout) -> None:
    body = _encoder.encode({"jsonrpc": "2.0", "method": method})
    async with http.post(url, data=body, headers=_headers(session_id), timeout=timeout,
                         allow_redirects=False) as response:
        if response.status // 100 != 2:
            raise McpFailure(f"the MCP server answered HTTP {response.status} to {method}", status=response.status)


async def begin(http: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> str | None:
    """A new session (``initialize``, then ``notifications/initialized``); its id, None from a stateless server."""
    _, session_id = await request(http, url, None, "initialize", {
        "protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}, timeout)
    await notify(http, url, session_id, "notifications/initialized", timeout)
    return session_id


async def ping(http: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> None:
    """Whether an MCP server answers: a session begun, pinged and ended (raises McpFailure, aiohttp errors)."""
    session_id = await begin(http, url, timeout)
    try:
        await request(http, url, session_id, "ping", {}, timeout)
    finally:
        if session_id is not None:
            async with http.delete(url, headers=_headers(session_id), timeout=timeout, allow_redirects=False):
                pass

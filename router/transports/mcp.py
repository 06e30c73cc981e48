"""MCP servers' tools as instances (``protocol: "mcp"``, the endpoint the server's Streamable HTTP URL with the
tool's name as its fragment: ``http://host:port/mcp#search``).

One session per server URL, begun on its first call and kept; a session the server has ended (404) is begun
again and the call sent again (it was refused unread). The payload is the tool's arguments (an object); a
result with ``isError`` is the agent's business error, its ``structuredContent`` (else its text, as JSON when
it is JSON) the result. A JSON-RPC error -32602 (unknown tool, bad arguments) is INVALID_PAYLOAD, any other the
agent's error. A streamed call is answered whole (progress is not relayed yet).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec
from agent_reach.atp import BusinessError, ErrorCode, RequestFrame
from yarl import URL

from mesh import mcp_client
from mesh.mcp_client import McpFailure
from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.tracecontext import CallSpan
from router.transports.answer import AgentAnswer

INVALID_PARAMS = -32602
_encoder = msgspec.json.Encoder()


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """The server's URL and the tool's name an endpoint names."""
    url = URL(endpoint)
    return str(url.with_fragment(None)), url.fragment


def _value(result: dict[str, Any]) -> Any:
    if "structuredContent" in result:
        return result["structuredContent"]
    texts = [part.get("text", "") for part in result.get("content", []) if isinstance(part, dict)
             and part.get("type") == "text"]
    text = "".join(texts)
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def answer_of(result: dict[str, Any]) -> AgentAnswer:
    value = _value(result)
    if result.get("isError") is True:
        message = value if isinstance(value, str) else _encoder.encode(value).decode()
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=message,
                           business_error=BusinessError(code="tool_error", message=message))
    return AgentAnswer(result=msgspec.Raw(_encoder.encode(value)))


class McpTransport:
    def __init__(self, session: aiohttp.ClientSession):
        self._http = session
        self._sessions: dict[str, str | None] = {}
        self._beginning: dict[str, asyncio.Lock] = {}
        # Set by the Forwarder like every transport's; MCP has no way to carry it, so servers are never told it.
        self.completion_url: str | None = None

    async def close(self) -> None:
        """The pool is the router's; the servers end idle sessions themselves."""

    async def _session(self, url: str, timeout: aiohttp.ClientTimeout, stale: str | None = None) -> str | None:
        """The server's session, begun once however many calls wait for it (again when ``stale`` ended)."""
        lock = self._beginning.setdefault(url, asyncio.Lock())
        async with lock:
            if url not in self._sessions or (stale is not None and self._sessions[url] == stale):
                self._sessions[url] = await mcp_client.begin(self._http, url, timeout)
            return self._sessions[url]

    async def _call(self, url: str, tool: str, arguments: dict[str, Any], timeout: aiohttp.ClientTimeout,
                    max_bytes: int) -> dict[str, Any]:
        session_id = await self._session(url, timeout)
        params = {"name": tool, "arguments": arguments}
        try:
            result, _ = await mcp_client.request(self._http, url, session_id, "tools/call", params, timeout, max_bytes)
        except McpFailure as failure:
            if failure.status != 404:
                raise
            session_id = await self._session(url, timeout, stale=session_id)
            result, _ = await mcp_client.request(self._http, url, session_id, "tools/call", params, timeout, max_bytes)
        return result

    async def send(self, endpoint: str, frame: RequestFrame, timeouts: ResolvedTimeouts, signing_key: str | None,
                   agent_id: str, max_answer_bytes: int, span: CallSpan, relay: Relay) -> AgentAnswer:
        started = time.monotonic()
        url, tool = split_endpoint(endpoint)
        if not isinstance(frame.payload, dict):
            return AgentAnswer(error_code=ErrorCode.INVALID_PAYLOAD, sent=False,
                               message="an MCP tool takes an object as its arguments: the payload must be one")
        timeout = aiohttp.ClientTimeout(total=None, connect=timeouts.connect_s, sock_connect=timeouts.connect_s)
        try:
            async with asyncio.timeout(timeouts.total_s):
                answer = answer_of(await self._call(url, tool, frame.payload, timeout, max_answer_bytes))
        except McpFailure as failure:
            code = ErrorCode.INVALID_PAYLOAD if failure.code == INVALID_PARAMS else ErrorCode.AGENT_ERROR
            answer = AgentAnswer(error_code=code, message=f"MCP server: {failure}")
        except aiohttp.ClientConnectorError as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False, message=f"connection failed: {exc}")
        except TimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT,
                                 message=f"call not finished within {timeouts.total_s * 1000:.0f} ms")
        except aiohttp.ClientError as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"MCP server connection broke: {exc!r}")
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        return answer

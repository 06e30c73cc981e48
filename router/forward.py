"""Moving one call's bytes to one agent instance, with connect / first-byte / total timeouts.

The router decides; this module only sends and classifies what came back, so every failure
becomes an ErrorCode and a flag saying whether the agent could have seen the request. Calls to
an instance that joined with a registration token are signed with that token's key
(``X-Reach-Signature``), so the agent can refuse calls that did not come through the mesh.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

import aiohttp
import msgspec
from agent_reach.atp import BusinessError, ErrorCode, RequestFrame
from agent_reach.signing import SIGNATURE_HEADER, sign
from yarl import URL

from router.policy import ResolvedTimeouts
from router.tracecontext import CallSpan

_encoder = msgspec.json.Encoder()


class AgentAnswer(msgspec.Struct, kw_only=True):
    """What one attempt produced: a result, or an error code with its story."""

    error_code: ErrorCode | None = None
    message: str = ""
    # False when the request never reached the agent (refused, connect timeout): failing over is safe.
    sent: bool = True
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: BusinessError | None = None
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_code is None


class _AgentReply(msgspec.Struct, kw_only=True):
    """The union of an ATP response frame and an error frame, as an agent may send either."""

    status: str | None = None
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: BusinessError | None = None
    error_code: str | None = None
    error_message: str = ""


_reply_decoder = msgspec.json.Decoder(_AgentReply)


def _atp_request(frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
    body = _encoder.encode(msgspec.structs.replace(frame, timeout_hint=timeout_hint_ms, intent=None))
    return body, {"Content-Type": "application/json"}


def _rest_request(frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
    headers = {"Content-Type": "application/json", "X-Reach-Context": _encoder.encode(frame.context).decode(),
               "X-Reach-Timeout-Ms": str(timeout_hint_ms)}
    return _encoder.encode(frame.payload), headers


# An agent refusing the router's own credentials (its signature) says nothing about the caller's:
# to the caller it is a failing instance, worth trying another one.
_AGENT_REFUSALS = frozenset({ErrorCode.UNAUTHENTICATED.value, ErrorCode.FORBIDDEN.value,
                             ErrorCode.TRUST_LEVEL_INSUFFICIENT.value})


def _classify_atp(status: int, body: bytes) -> AgentAnswer:
    try:
        reply = _reply_decoder.decode(body)
    except msgspec.MsgspecError:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered HTTP {status} without a frame")
    if reply.error_code in _AGENT_REFUSALS:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR,
                           message=f"agent refused the router's call ({reply.error_code}): {reply.error_message}")
    if reply.error_code is not None:
        code = ErrorCode(reply.error_code) if reply.error_code in ErrorCode.__members__ else ErrorCode.AGENT_ERROR
        return AgentAnswer(error_code=code, message=reply.error_message or reply.error_code,
                           business_error=reply.business_error)
    if reply.business_error is not None:
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=reply.business_error.message,
                           business_error=reply.business_error, result=reply.result)
    if reply.status == "busy":
        return AgentAnswer(error_code=ErrorCode.BUSY, message="agent answered busy")
    if reply.status == "error" or status >= 400:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered status error (HTTP {status})")
    return AgentAnswer(result=reply.result, context_update=reply.context_update)


_business_decoder = msgspec.json.Decoder(dict[str, Any] | list[Any] | str | int | float | bool | None)
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)


def _classify_rest(status: int, body: bytes) -> AgentAnswer:
    if status == 429:
        return AgentAnswer(error_code=ErrorCode.BUSY, message="agent answered HTTP 429")
    if status >= 400:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered HTTP {status}")
    try:
        if b'"business_error"' not in body:
            # Checked as JSON, then passed through as bytes: the router has no reason to rebuild it.
            return AgentAnswer(result=_raw_decoder.decode(body) if body else None)
        result = _business_decoder.decode(body)
    except msgspec.MsgspecError:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message="agent answered a body that is not JSON")
    if isinstance(result, dict) and result.get("business_error") is not None:
        raw = result["business_error"]
        business = msgspec.convert(raw, BusinessError) if isinstance(raw, dict) and "code" in raw \
            else BusinessError(code=str(raw))
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                           business_error=business, result=result)
    return AgentAnswer(result=result)


_PROTOCOLS = {"atp": (_atp_request, _classify_atp), "rest": (_rest_request, _classify_rest)}


@functools.lru_cache(maxsize=1024)
def _client_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s)


@functools.lru_cache(maxsize=4096)
def _path(endpoint: str) -> str:
    """The path an agent sees for ``endpoint`` (decoded, no query): what the signature binds."""
    return URL(endpoint).path


class Forwarder:
    """One shared keep-alive connection pool for every agent."""

    def __init__(self, session: aiohttp.ClientSession, completion_url: str | None = None):
        self._session = session
        self.completion_url = completion_url

    async def send(self, endpoint: str, protocol: str, frame: RequestFrame, timeouts: ResolvedTimeouts,
                   signing_key: str | None = None, agent_id: str = "", *, span: CallSpan) -> AgentAnswer:
        """``signing_key``: the key of the registration token the instance ``agent_id`` joined with, if any;
        the signature names ``agent_id`` so that it verifies at that instance only."""
        # One coroutine, not a timing wrapper around another: every await resumes through each frame.
        build, classify = _PROTOCOLS[protocol]
        body, headers = build(frame, int(timeouts.total_s * 1000))
        headers["X-Request-Id"] = frame.request_id
        headers["traceparent"] = span.traceparent
        if span.tracestate is not None:
            headers["tracestate"] = span.tracestate
        if signing_key is not None:
            headers[SIGNATURE_HEADER] = sign(signing_key, agent_id, "POST", _path(endpoint), frame.request_id, body)
        if self.completion_url:
            headers["X-Reach-Completion-Url"] = self.completion_url
        client_timeout = _client_timeout(timeouts.connect_s)
        # One timer for both deadlines: the first byte's, then (headers in) the whole call's.
        now = asyncio.get_running_loop().time()
        started = time.monotonic()
        first_byte_fires = timeouts.first_byte_s < timeouts.total_s
        stage = "first_byte"
        try:
            async with asyncio.timeout_at(now + min(timeouts.first_byte_s, timeouts.total_s)) as deadline:
                response = await self._session.post(endpoint, data=body, headers=headers, timeout=client_timeout)
                stage = "body"
                if first_byte_fires:
                    deadline.reschedule(now + timeouts.total_s)
                async with response:
                    raw = await response.read()
                answer = classify(response.status, raw)
        except aiohttp.ConnectionTimeoutError:
            answer = AgentAnswer(error_code=ErrorCode.CONNECT_TIMEOUT, sent=False,
                                 message=f"no connection within {timeouts.connect_s * 1000:.0f} ms")
        except aiohttp.ClientConnectorError as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, sent=False, message=f"connection failed: {exc}")
        except TimeoutError:
            if stage == "first_byte" and first_byte_fires:
                answer = AgentAnswer(error_code=ErrorCode.FIRST_BYTE_TIMEOUT,
                                     message=f"no answer within {timeouts.first_byte_s * 1000:.0f} ms")
            else:
                answer = AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT,
                                     message=f"call not finished within {timeouts.total_s * 1000:.0f} ms")
        except aiohttp.ClientError as exc:
            answer = AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent connection broke: {exc!r}")
        answer.elapsed_ms = (time.monotonic() - started) * 1000
        return answer

"""ATP agents (``protocol: "atp"``, the SDK's): the request frame is the body, the answer a response or an error
frame, a stream's events ATP chunks ending in a response or error event."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from agent_reach import peer_json
from agent_reach.atp import BUSINESS_ERROR_SHAPE, ErrorCode, RequestFrame, agent_business_error
from agent_reach.sse import CHUNK, ERROR, MESSAGE, RESPONSE
from agent_reach.usage import usage_from

from router.transports.answer import AgentAnswer, failed_status, malformed
from router.transports.http import Dialect, Step

_encoder = msgspec.json.Encoder()


class _AgentReply(msgspec.Struct, kw_only=True):
    """The union of an ATP response frame and an error frame, as an agent may send either."""

    status: Literal["success", "error", "busy"] | None = None
    result: Any = None
    context_update: dict[str, Any] | None = None
    business_error: Any = None  # read by agent_business_error: a numeric code is a business error too
    error_code: str | None = None
    error_message: str = ""
    usage: Any = None  # read by usage_from: a garbled report is dropped, never a failed call


_reply_decoder = peer_json.Decoder(_AgentReply, limit=peer_json.MAX_PASSED_DEPTH)
# An agent refusing the router's own credentials (its signature) says nothing about the caller's:
# to the caller it is a failing instance, worth trying another one.
_AGENT_REFUSALS = frozenset({ErrorCode.UNAUTHENTICATED.value, ErrorCode.FORBIDDEN.value,
                             ErrorCode.TRUST_LEVEL_INSUFFICIENT.value})
# The codes an agent's frame may carry. INTERNAL_ERROR is the router's own failure, never counted against
# an instance: an agent saying it is answered AGENT_ERROR, or it could pass its failures off as the router's.
_AGENT_CODES = {code.value: code for code in ErrorCode if code is not ErrorCode.INTERNAL_ERROR}


def classify_frame(status: int, body: bytes) -> AgentAnswer:
    """What an agent's ATP frame says (an ATP agent's answer, and any agent's stream ``error`` event)."""
    try:
        reply = _reply_decoder.decode(body)
    except msgspec.MsgspecError as exc:  # an answer nested past any need (peer_json.TooDeep) too
        return malformed(f"not a frame ({exc})") if 200 <= status < 300 else failed_status(status)
    if reply.error_code is None and reply.status is None:
        return malformed("a frame needs status or error_code")
    business = agent_business_error(reply.business_error) if reply.business_error is not None else None
    if business is None and reply.business_error is not None:
        return malformed(BUSINESS_ERROR_SHAPE)
    if reply.error_code in _AGENT_REFUSALS:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR,
                           message=f"agent refused the router's call ({reply.error_code}): {reply.error_message}")
    if reply.error_code is not None:
        return AgentAnswer(error_code=_AGENT_CODES.get(reply.error_code, ErrorCode.AGENT_ERROR),
                           message=reply.error_message or reply.error_code, business_error=business)
    if business is not None:
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                           business_error=business, result=reply.result)
    if reply.status == "busy":
        return AgentAnswer(error_code=ErrorCode.BUSY, message="agent answered busy")
    if reply.status == "error" or not 200 <= status < 300:
        return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, message=f"agent answered status error (HTTP {status})")
    return AgentAnswer(result=reply.result, context_update=reply.context_update, usage=usage_from(reply.usage))


def checked_chunk(data: bytes) -> bytes:
    """A chunk event's data checked (UTF-8, which Raw does not check, and depth) before it is read."""
    if not data.isascii():
        data.decode()
    peer_json.check(data, peer_json.MAX_PASSED_DEPTH)
    return data


def chunk_raw(text: bytes) -> msgspec.Raw:
    """A chunk's JSON as passed on inside the router's own event, on one line: a raw line end can only be
    whitespace between JSON tokens, so a space stands for it."""
    return msgspec.Raw(text.replace(b"\n", b" ").replace(b"\r", b" "))


class _AgentChunk(msgspec.Struct):
    data: msgspec.Raw = msgspec.Raw(b"null")


_chunk_decoder = msgspec.json.Decoder(_AgentChunk)


class EventDialect(Dialect):
    """A protocol streaming the SDK's events: chunks, then a ``response`` (read as the protocol's whole answer)
    or an ``error`` frame; any other event (a keep-alive, say) is nothing for the caller."""

    def chunk(self, data: bytes) -> msgspec.Raw:
        """The JSON a chunk event carries, checked."""
        raise NotImplementedError

    def step(self, name: str, data: bytes, last: msgspec.Raw) -> Step:
        if name == RESPONSE:
            return Step([], self.classify(200, data))
        if name == ERROR:
            return Step([], classify_frame(502, data))
        if name not in (CHUNK, MESSAGE):
            return Step([])
        try:
            return Step([self.chunk(data)])
        except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
            return Step([], malformed(f"a chunk is not JSON ({exc})"))


class AtpDialect(EventDialect):
    def request(self, frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
        body = _encoder.encode(msgspec.structs.replace(frame, timeout_hint=timeout_hint_ms, intent=None))
        return body, {"Content-Type": "application/json"}

    def classify(self, status: int, body: bytes) -> AgentAnswer:
        return classify_frame(status, body)

    def chunk(self, data: bytes) -> msgspec.Raw:
        return chunk_raw(bytes(_chunk_decoder.decode(checked_chunk(data)).data))

"""Plain JSON agents (``protocol: "rest"``): the payload is the body, the context and the deadline travel in
headers, the answer is the result (with an optional top-level ``business_error`` and ``usage``), a stream's
events carry chunks as their data and may end without a final event."""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach import peer_json
from agent_reach.atp import BUSINESS_ERROR_SHAPE, ErrorCode, RequestFrame, agent_business_error
from agent_reach.headers import CONTEXT_HEADER, TIMEOUT_HEADER
from agent_reach.usage import Usage, usage_from

from router.transports.answer import AgentAnswer, failed_status, malformed
from router.transports.atp import EventDialect, checked_chunk, chunk_raw

# A rest agent gets the context in one header (X-Reach-Context), so the router's edge refuses a larger
# one: with the other headers it stays well inside the 8 KiB a header line may have at common servers
# (aiohttp, nginx), and a refusal is the caller's, not an agent failure that could open a breaker.
MAX_CONTEXT_BYTES = 4096

_encoder = msgspec.json.Encoder()
_business_decoder = msgspec.json.Decoder(dict[str, Any] | list[Any] | str | int | float | bool | None)
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)


class _RestUsage(msgspec.Struct):
    """A rest answer's top-level ``usage``, read apart from the answer, which is passed on untouched."""

    usage: Any = None


_rest_usage_decoder = msgspec.json.Decoder(_RestUsage)


def _rest_usage(body: bytes) -> Usage | None:
    """The usage a rest answer carries; only answers that name one are read twice (an object's other
    members are skipped, an answer that is no object has none)."""
    if b'"usage"' not in body:
        return None
    try:
        return usage_from(_rest_usage_decoder.decode(body).usage)
    except msgspec.MsgspecError:
        return None


class RestDialect(EventDialect):
    def request(self, frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json", CONTEXT_HEADER: _encoder.encode(frame.context).decode(),
                   TIMEOUT_HEADER: str(timeout_hint_ms)}
        return _encoder.encode(frame.payload), headers

    def classify(self, status: int, body: bytes) -> AgentAnswer:
        if not 200 <= status < 300:
            return failed_status(status)
        try:
            peer_json.check(body, peer_json.MAX_PASSED_DEPTH)  # once: both decodes below then stay within it
            if b'"business_error"' not in body:
                # Checked as JSON (syntax, and UTF-8, which Raw does not check), then passed through as bytes:
                # the router has no reason to rebuild it.
                if not body.isascii():
                    body.decode()
                return AgentAnswer(result=_raw_decoder.decode(body) if body else None, usage=_rest_usage(body))
            result = _business_decoder.decode(body)
        except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
            return malformed(f"the body is not JSON ({exc})")
        raw = result.get("business_error") if isinstance(result, dict) else None
        if raw is None:
            return AgentAnswer(result=result,
                               usage=usage_from(result.get("usage")) if isinstance(result, dict) else None)
        business = agent_business_error(raw)
        if business is None:
            return malformed(BUSINESS_ERROR_SHAPE)
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                           business_error=business, result=result)

    def chunk(self, data: bytes) -> msgspec.Raw:
        return chunk_raw(bytes(_raw_decoder.decode(checked_chunk(data))))

    def unfinished(self, last: msgspec.Raw) -> AgentAnswer:
        """A rest agent's stream may simply end: its last chunk is the result."""
        return AgentAnswer(result=last)

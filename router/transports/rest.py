"""Plain JSON agents (``protocol: "rest"``): the payload is the body, the context and the deadline travel in
headers, the answer is the result (with an optional top-level ``business_error`` and ``usage``), a stream's
events carry chunks as their data and may end without a final event."""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach import peer_json
from agent_reach.atp import BUSINESS_ERROR_SHAPE, ErrorCode, RequestFrame, agent_business_error
from agent_reach.headers import CONTEXT_HEADER, TIMEOUT_HEADER
from agent_reach.usage import usage_from

from router.transports.answer import AgentAnswer, failed_status, malformed
from router.transports.atp import EventDialect, checked_chunk, chunk_raw

# A rest agent gets the context in one header (X-Reach-Context), so the router's edge refuses a larger
# one: with the other headers it stays well inside the 8 KiB a header line may have at common servers
# (aiohttp, nginx), and a refusal is the caller's, not an agent failure that could open a breaker.
MAX_CONTEXT_BYTES = 4096

_encoder = msgspec.json.Encoder()
_business_decoder = msgspec.json.Decoder(dict[str, Any])
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)


class _Members(msgspec.Struct):
    """The top-level members of a rest answer the router reads; the answer itself is passed on untouched."""

    business_error: Any = None
    usage: Any = None


_members_decoder = msgspec.json.Decoder(_Members)


def _members(body: bytes) -> _Members | None:
    """One pass over the answer, which checks its syntax too (its other members are skipped in C); None when
    it is valid JSON but not an object. Cheaper than looking for the members' names in the bytes first: a
    substring search steps one byte at a time through text made of the name's own letters (8 µs a KB)."""
    try:
        return _members_decoder.decode(body)
    except msgspec.ValidationError:  # an array, a string, a number...: no members
        _raw_decoder.decode(body)
        return None


class RestDialect(EventDialect):
    def request(self, frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json", CONTEXT_HEADER: _encoder.encode(frame.context).decode(),
                   TIMEOUT_HEADER: str(timeout_hint_ms)}
        return _encoder.encode(frame.payload), headers

    def classify(self, status: int, body: bytes) -> AgentAnswer:
        if not 200 <= status < 300:
            return failed_status(status)
        if not body:
            return AgentAnswer(result=None)
        try:
            peer_json.check(body, peer_json.MAX_PASSED_DEPTH)  # once: the decodes below then stay within it
            # Checked as JSON (syntax, and UTF-8, which skipping members does not check), then passed through as
            # bytes: the router has no reason to rebuild it.
            if not body.isascii():
                body.decode()
            members = _members(body)
            if members is None or members.business_error is None:
                # JSON allows nothing else around a value: what the decoder accepted, stripped, is the value.
                return AgentAnswer(result=msgspec.Raw(body.strip()),
                                   usage=usage_from(members.usage) if members is not None else None)
            result = _business_decoder.decode(body)
        except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
            return malformed(f"the body is not JSON ({exc})")
        business = agent_business_error(members.business_error)
        if business is None:
            return malformed(BUSINESS_ERROR_SHAPE)
        return AgentAnswer(error_code=ErrorCode.BUSINESS_ERROR, message=business.message or business.code,
                           business_error=business, result=result)

    def chunk(self, data: bytes) -> msgspec.Raw:
        return chunk_raw(bytes(_raw_decoder.decode(checked_chunk(data))))

    def unfinished(self, last: msgspec.Raw) -> AgentAnswer:
        """A rest agent's stream may simply end: its last chunk is the result."""
        return AgentAnswer(result=last)

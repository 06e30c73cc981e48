"""Moving one request frame over HTTP and turning whatever comes back into a frame.

Two wire forms: ``atp`` (the frame is the body; the router's /atp and SDK agents speak it) and
``rest`` (the payload is the body, the context travels in headers). Callers always get a
ResponseFrame or an ErrorFrame back; only a connection that never opened raises
:class:`Unreachable`, because that is the one case where trying elsewhere is always safe
(``exchange`` also raises :class:`Silent` for a request that got no answer in time).
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import msgspec

from agent_reach import peer_json
from agent_reach.atp import (
    BUSINESS_ERROR_SHAPE,
    ErrorCode,
    ErrorFrame,
    RequestFrame,
    ResponseFrame,
    agent_business_error,
    agent_status_code,
    error_frame,
)
from agent_reach.context import traceparent
from agent_reach.headers import CONTEXT_HEADER, REQUEST_ID_HEADER, TRACEPARENT_HEADER
from agent_reach.sse import CHUNK, ERROR, EVENT_STREAM, RESPONSE, ChunkFrame, EventParser

Answer = ResponseFrame | ErrorFrame
# What a streamed call yields: its chunks, then its final frame.
Streamed = ChunkFrame | Answer

_encoder = msgspec.json.Encoder()
_response = peer_json.Decoder(ResponseFrame)
_error = peer_json.Decoder(ErrorFrame)
_chunk = peer_json.Decoder(ChunkFrame)
_STATUS_CODES = {
    400: ErrorCode.INVALID_FRAME, 413: ErrorCode.PAYLOAD_TOO_LARGE, 429: ErrorCode.BUSY,
    504: ErrorCode.TOTAL_TIMEOUT,
}


class Unreachable(Exception):
    """The connection could not be opened (refused, unresolvable, connect timeout), or a kept-alive one was
    found closed before the request was written: nothing was sent."""


class Silent(Exception):
    """Sent, and nothing came back in time: the peer may have run it, so it is not sent again, but a peer
    that answers nothing (hung, or SIGSTOPped: the kernel still completes its handshakes) is suspect."""


def url_list(urls: str | Sequence[str]) -> list[str]:
    """Several URLs of one service, as a list or one comma-separated string (a command-line flag)."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = [url.strip().rstrip("/") for url in items if url.strip()]
    if not cleaned:
        raise ValueError(f"no URL in {urls!r}")
    return cleaned


class Failover:
    """Several URLs of one service and which to try first: the one that answered last, then the others
    in the order given; a URL that failed waits out its own backoff (capped exponential, jittered)
    behind those that did not, so a dead one is not hammered while a live one answers."""

    def __init__(self, urls: str | Sequence[str], *, base: float = 0.1, cap: float = 5.0):
        self.urls = url_list(urls)
        self._base, self._cap = base, cap
        self._first = 0
        self._failures = [0] * len(self.urls)
        self._ready_at = [0.0] * len(self.urls)

    @property
    def current(self) -> str:
        """The URL tried first: the one that answered last (the first given until one did)."""
        return self.urls[self._first]

    def order(self) -> list[str]:
        """Every URL, those ready now first (from the current one on), then the others soonest ready first."""
        now = time.monotonic()
        turn = [(self._first + step) % len(self.urls) for step in range(len(self.urls))]
        return [self.urls[i] for i in sorted(turn, key=lambda i: max(0.0, self._ready_at[i] - now))]

    def wait(self) -> float:
        """Seconds until some URL's backoff runs out (0 if one is ready now)."""
        return max(0.0, min(self._ready_at) - time.monotonic())

    def answered(self, url: str) -> None:
        index = self.urls.index(url)
        self._first, self._failures[index], self._ready_at[index] = index, 0, 0.0

    def failed(self, url: str) -> float:
        """Mark ``url`` failing; returns its backoff in seconds."""
        index = self.urls.index(url)
        self._failures[index] += 1
        delay = min(self._cap, self._base * 2.0 ** min(self._failures[index] - 1, 16)) * random.uniform(0.5, 1.0)
        self._ready_at[index] = time.monotonic() + delay
        return delay


def call_headers(frame: RequestFrame) -> dict[str, str]:
    headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: frame.request_id}
    parent = traceparent(frame.context.get("trace_id"))
    if parent is not None:
        headers[TRACEPARENT_HEADER] = parent
    return headers


def _status_message(status: int, body: bytes) -> str:
    return f"HTTP {status}: {body[:200].decode(errors='replace')}"


def status_error(request_id: str, status: int, body: bytes) -> ErrorFrame:
    """An error frame for an HTTP answer that carried no frame of its own."""
    return error_frame(request_id, _STATUS_CODES.get(status, ErrorCode.AGENT_ERROR), _status_message(status, body))


def decode_atp(request_id: str, status: int, body: bytes) -> Answer:
    try:
        return _response.decode(body) if status == 200 else _error.decode(body)
    except msgspec.DecodeError:
        return status_error(request_id, status, body)


def decode_rest(request_id: str, status: int, body: bytes) -> Answer:
    """A REST agent's answer as a frame, read as the router reads it: its JSON is the result; a top-level
    ``business_error`` is a failure."""
    if not 200 <= status < 300:
        return error_frame(request_id, agent_status_code(status), _status_message(status, body))
    try:
        result = peer_json.decode(body) if body else None
    except msgspec.DecodeError as exc:
        return error_frame(request_id, ErrorCode.AGENT_ERROR, f"answer is not usable JSON: {exc}")
    raw = result.get("business_error") if isinstance(result, dict) else None
    if raw is None:
        return ResponseFrame(request_id=request_id, status="success", result=result)
    failure = agent_business_error(raw)
    if failure is None:
        return error_frame(request_id, ErrorCode.AGENT_ERROR, f"answer is not usable: {BUSINESS_ERROR_SHAPE}")
    return ResponseFrame(request_id=request_id, status="error", business_error=failure)


async def post(session: aiohttp.ClientSession, url: str, frame: RequestFrame, *, protocol: str = "atp",
               headers: dict[str, str] | None = None, timeout: aiohttp.ClientTimeout | None = None) -> Answer:
    """POST ``frame`` to ``url`` in ``protocol`` form; raises Unreachable only if nothing was sent."""
    try:
        return await exchange(session, url, frame, protocol=protocol, headers=headers, timeout=timeout)
    except Silent as exc:
        return error_frame(frame.request_id, ErrorCode.TOTAL_TIMEOUT, str(exc))


async def exchange(session: aiohttp.ClientSession, url: str, frame: RequestFrame, *, protocol: str = "atp",
                   headers: dict[str, str] | None = None, timeout: aiohttp.ClientTimeout | None = None) -> Answer:
    """``post``, for a caller that treats silence apart: raises Unreachable if nothing was sent, Silent if
    nothing came back in time."""
    sent = {**call_headers(frame), **(headers or {})}
    if protocol == "rest":
        sent[CONTEXT_HEADER] = _encoder.encode(frame.context).decode()
        body: Any = _encoder.encode(frame.payload)
        decode = decode_rest
    else:
        body = _encoder.encode(frame)
        decode = decode_atp
    try:
        # Never to a redirect's target: the headers carry the caller's credentials.
        async with session.post(url, data=body, headers=sent, timeout=timeout, allow_redirects=False) as response:
            return decode(frame.request_id, response.status, await response.read())
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise Unreachable(f"{url}: {exc}") from exc
    except TimeoutError as exc:
        raise Silent(f"no answer from {url} in time") from exc
    except aiohttp.ClientError as exc:
        if _nothing_written(exc):
            raise Unreachable(f"{url}: {exc}") from exc
        return error_frame(frame.request_id, ErrorCode.AGENT_ERROR, f"connection to {url} failed: {exc}")

async def exchange_stream(session: aiohttp.ClientSession, url: str, frame: RequestFrame, *,
                          headers: dict[str, str] | None = None,
                          timeout: aiohttp.ClientTimeout | None = None) -> AsyncIterator[Streamed]:
    """POST ``frame`` asking for a stream: each chunk as it arrives, then the final frame (an answer that is
    not a stream, a refusal say, is its final frame alone). Raises Unreachable only if nothing was sent;
    a stream cut short ends with an error frame. Closing the iterator early hangs up: the call is cancelled."""
    sent = {**call_headers(frame), "Accept": f"{EVENT_STREAM}, application/json", **(headers or {})}
    try:
        async with session.post(url, data=_encoder.encode(frame), headers=sent, timeout=timeout,
                                allow_redirects=False) as response:
            if response.content_type != EVENT_STREAM:
                yield decode_atp(frame.request_id, response.status, await response.read())
                return
            parser = EventParser()
            async for received in response.content.iter_any():
                for event in parser.feed(received):
                    if event.name == CHUNK:
                        yield _chunk.decode(event.data)
                    elif event.name in (RESPONSE, ERROR):
                        yield (_response if event.name == RESPONSE else _error).decode(event.data)
                        return
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise Unreachable(f"{url}: {exc}") from exc
    except TimeoutError:
        yield error_frame(frame.request_id, ErrorCode.TOTAL_TIMEOUT, f"the stream from {url} did not end in time")
        return
    except (aiohttp.ClientError, msgspec.DecodeError) as exc:
        yield error_frame(frame.request_id, ErrorCode.AGENT_ERROR, f"the stream from {url} broke: {exc}")
        return
    yield error_frame(frame.request_id, ErrorCode.AGENT_ERROR, f"the stream from {url} ended without a final frame")


def _nothing_written(exc: aiohttp.ClientError) -> bool:
    """A kept-alive connection the peer closed (a router killed) taken from the pool before the close was
    read: aiohttp finds it closing when it comes to write and writes nothing more. Headers go out with the
    body's first bytes, so at most part of a body left on a connection already closed: no peer could have
    read the whole request. Safe to send elsewhere, as Go's client does for any method."""
    cause = exc.__cause__
    return (isinstance(exc, aiohttp.ClientOSError) and isinstance(cause, aiohttp.ClientConnectionResetError)
            and "closing transport" in str(cause))

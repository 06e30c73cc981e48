"""Calling A2A agents as mesh instances (``protocol: "a2a"``, ``endpoint`` = the agent's card URL).

The router reads the card to learn where the agent takes JSON-RPC (cached a minute per card), sends
SendMessage, or SendStreamingMessage when the caller streams, and reads the answer back as ATP: a
completed task's artifacts (or a message's parts) are the result, every part of an artifact update a
chunk. Task states and JSON-RPC errors become ATP codes (``verdict_of``, ``_ENDED``). Pure functions
turn bytes into a ``Verdict``; router/forward.py makes it an AgentAnswer and owns the timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, NamedTuple

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.atp import ErrorCode, RequestFrame
from yarl import URL

from router.a2a.wire import CONTENT_TYPE_NOT_SUPPORTED, INVALID_PARAMS, INVALID_REQUEST, Part

VERSION_HEADER = "A2A-Version"
PROTOCOL_VERSION = "1.0"
CARD_TTL_S = 60.0
MAX_CARDS = 4096
MAX_CARD_BYTES = 256 * 1024
CANCEL_TIMEOUT = aiohttp.ClientTimeout(total=5)
log = logging.getLogger("agentreach.router.a2a")
_encoder = msgspec.json.Encoder()


class Verdict(NamedTuple):
    """What an A2A answer says, in ATP terms: a result, or an error code (a business error's code too)."""

    result: msgspec.Raw | None = None
    error_code: ErrorCode | None = None
    message: str = ""
    business_code: str | None = None


class StreamStep(NamedTuple):
    chunks: list[msgspec.Raw]
    final: Verdict | None
    task_id: str = ""  # the agent's task, once an event names it: what to cancel if the mesh gives up


class CardError(Exception):
    """The agent's card cannot be read or names no JSON-RPC endpoint: nothing was sent to the agent."""


class _Interface(msgspec.Struct, kw_only=True, rename="camel"):
    url: str = ""
    protocol_binding: str = ""
    protocol_version: str = ""


class Skill(msgspec.Struct, kw_only=True):
    id: str = ""
    name: str = ""
    description: str = ""
    examples: list[str] = []


class AgentCardView(msgspec.Struct, kw_only=True, rename="camel"):
    """What the mesh reads of an Agent Card (v1.0, or v0.3's ``url`` and ``preferredTransport``)."""

    name: str = ""
    description: str = ""
    version: str = ""
    skills: list[Skill] = []
    supported_interfaces: list[_Interface] = []
    url: str | None = None
    preferred_transport: str = "JSONRPC"


def read_card(body: bytes) -> AgentCardView:
    try:
        card = peer_json.decode(body, type=AgentCardView)
    except msgspec.MsgspecError as exc:
        raise CardError(f"the agent's card is not an A2A card: {exc}") from None
    jsonrpc_url(card)
    return card


def jsonrpc_url(card: AgentCardView) -> str:
    """The card's JSON-RPC endpoint, v1.x first; http(s) only (the router posts calls there)."""
    interfaces = [i for i in card.supported_interfaces if i.protocol_binding == "JSONRPC"]
    interfaces.sort(key=lambda i: not i.protocol_version.startswith("1."))
    urls = [i.url for i in interfaces]
    if card.url and card.preferred_transport == "JSONRPC":
        urls.append(card.url)
    for url in urls:
        if URL(url).scheme in ("http", "https") and URL(url).host:
            return url
    raise CardError("the agent's card names no http(s) JSON-RPC endpoint")


async def fetch_card(session: aiohttp.ClientSession, card_url: str, timeout: aiohttp.ClientTimeout) -> AgentCardView:
    """The card at ``card_url`` (never a redirect's: the router would post calls wherever it said),
    read up to ``MAX_CARD_BYTES``."""
    async with session.get(card_url, timeout=timeout, allow_redirects=False) as response:
        if response.status != 200:
            raise CardError(f"the agent's card answered HTTP {response.status}")
        body = bytearray()
        async for piece in response.content.iter_any():
            body += piece
            if len(body) > MAX_CARD_BYTES:
                raise CardError(f"the agent's card exceeds {MAX_CARD_BYTES} bytes")
    return read_card(bytes(body))


class A2AAgents:
    """The router's dealings with A2A agents beside the call itself: each one's JSON-RPC endpoint, read
    from its card and kept ``CARD_TTL_S`` seconds, and cancelling the tasks of calls the mesh gave up on."""

    def __init__(self, session: aiohttp.ClientSession):
        self._session = session
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._cancelling: set[asyncio.Future[None]] = set()

    async def rpc_url(self, card_url: str, timeout: aiohttp.ClientTimeout) -> str:
        now = time.monotonic()
        known = self._known.get(card_url)
        if known is not None and known[1] > now:
            return known[0]
        url = jsonrpc_url(await fetch_card(self._session, card_url, timeout))
        self._known[card_url] = (url, now + CARD_TTL_S)
        self._known.move_to_end(card_url)
        if len(self._known) > MAX_CARDS:
            self._known.popitem(last=False)
        return url

    def cancel(self, rpc_url: str, task_id: str) -> None:
        """CancelTask, sent after the call ended: an A2A agent works on when its stream's reader leaves
        (the a2a-sdk's server does), so closing the connection alone would leave it working for nobody."""
        sending = asyncio.ensure_future(self._cancel(rpc_url, task_id))
        self._cancelling.add(sending)
        sending.add_done_callback(self._cancelling.discard)

    async def _cancel(self, rpc_url: str, task_id: str) -> None:
        body = _encoder.encode({"jsonrpc": "2.0", "id": task_id, "method": "CancelTask", "params": {"id": task_id}})
        headers = {"Content-Type": "application/json", VERSION_HEADER: PROTOCOL_VERSION}
        try:
            async with self._session.post(rpc_url, data=body, headers=headers, timeout=CANCEL_TIMEOUT,
                                          allow_redirects=False) as response:
                log.info("a2a task cancelled at the agent", extra={"task_id": task_id, "status": response.status})
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("a2a task could not be cancelled at the agent", extra={"task_id": task_id,
                                                                               "error": str(exc)})


def _part(value: Any) -> dict[str, Any]:
    return {"text": value} if isinstance(value, str) else {"data": value}


def a2a_request(frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
    """The call as A2A: the payload one part (a string as text, anything else as data), the ATP
    context and the time left in the request's metadata, the context's session the A2A contextId."""
    message: dict[str, Any] = {"messageId": frame.request_id, "role": "ROLE_USER", "parts": [_part(frame.payload)]}
    session = frame.context.get("session_id")
    if isinstance(session, str) and session:
        message["contextId"] = session
    envelope = {"jsonrpc": "2.0", "id": frame.request_id,
                "method": "SendStreamingMessage" if frame.stream else "SendMessage",
                "params": {"message": message, "metadata": {"context": frame.context, "timeout_hint": timeout_hint_ms}}}
    return _encoder.encode(envelope), {"Content-Type": "application/json", VERSION_HEADER: PROTOCOL_VERSION}


class _Message(msgspec.Struct, kw_only=True):
    parts: list[Part] = []


class _Artifact(msgspec.Struct, kw_only=True):
    parts: list[Part] = []


class _Status(msgspec.Struct, kw_only=True):
    state: str = ""
    message: _Message | None = None


class _Task(msgspec.Struct, kw_only=True):
    id: str = ""
    status: _Status = msgspec.field(default_factory=_Status)
    artifacts: list[_Artifact] = []


class _StatusUpdate(msgspec.Struct, kw_only=True, rename="camel"):
    task_id: str = ""
    status: _Status = msgspec.field(default_factory=_Status)


class _ArtifactUpdate(msgspec.Struct, kw_only=True, rename="camel"):
    task_id: str = ""
    artifact: _Artifact = msgspec.field(default_factory=_Artifact)


class _Result(msgspec.Struct, kw_only=True, rename="camel"):
    """A SendMessage result or a stream event, v1 (one member named) or v0.3 (the object itself, ``kind``)."""

    task: _Task | None = None
    message: _Message | None = None
    status_update: _StatusUpdate | None = None
    artifact_update: _ArtifactUpdate | None = None


class _RpcError(msgspec.Struct, kw_only=True):
    code: int = 0
    message: str = ""


class _Reply(msgspec.Struct, kw_only=True):
    result: Any = None
    error: _RpcError | None = None


_reply_decoder = peer_json.Decoder(_Reply, limit=peer_json.MAX_PASSED_DEPTH)
_V03_KINDS = {"task": "task", "message": "message", "status-update": "statusUpdate",
              "artifact-update": "artifactUpdate"}
# A task that ended other than completed, as ATP: (code, business error code when it is the caller's to act on).
_ENDED: dict[str, tuple[ErrorCode, str | None]] = {
    "failed": (ErrorCode.AGENT_ERROR, None), "canceled": (ErrorCode.AGENT_ERROR, None),
    "rejected": (ErrorCode.BUSINESS_ERROR, "A2A_REJECTED"),
    "input_required": (ErrorCode.BUSINESS_ERROR, "A2A_INPUT_REQUIRED"),
    "auth_required": (ErrorCode.BUSINESS_ERROR, "A2A_AUTH_REQUIRED"),
}
# The agent refused the request as malformed: the same request fails everywhere.
_INVALID = {INVALID_PARAMS, INVALID_REQUEST, CONTENT_TYPE_NOT_SUPPORTED}


def state_of(name: str) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` (v1) and ``input-required`` (v0.3) alike: ``input_required``."""
    return name.removeprefix("TASK_STATE_").lower().replace("-", "_")


def _value(part: Part) -> Any:
    if part.text is not None:
        return part.text
    if part.data is not msgspec.UNSET:
        return part.data
    return msgspec.to_builtins(part)


def _values(parts: list[Part]) -> list[msgspec.Raw]:
    return [msgspec.Raw(_encoder.encode(_value(part))) for part in parts]


def _joined(parts: list[Part]) -> msgspec.Raw:
    """Several parts are one result as a list; one part is its value."""
    values = [_value(part) for part in parts]
    return msgspec.Raw(_encoder.encode(values[0] if len(values) == 1 else values))


def _task_result(task: _Task) -> msgspec.Raw | None:
    parts = [part for artifact in task.artifacts for part in artifact.parts]
    return _joined(parts) if parts else None


def _said(status: _Status) -> str:
    parts = status.message.parts if status.message is not None else []
    return " ".join(part.text for part in parts if part.text) or f"the agent's task ended {state_of(status.state)}"


def _ended(status: _Status, result: msgspec.Raw | None) -> Verdict | None:
    """A terminal (or interrupted) state as a verdict; None while the task still runs."""
    state = state_of(status.state)
    if state == "completed":
        return Verdict(result=result)
    if state in _ENDED:
        code, business = _ENDED[state]
        return Verdict(error_code=code, message=_said(status), business_code=business)
    return None


def _result(raw: Any) -> _Result:
    if isinstance(raw, dict) and raw.get("kind") in _V03_KINDS:
        raw = {_V03_KINDS[raw["kind"]]: raw}
    return msgspec.convert(raw, _Result)


def _rpc_error(error: _RpcError) -> Verdict:
    code = ErrorCode.INVALID_PAYLOAD if error.code in _INVALID else ErrorCode.AGENT_ERROR
    return Verdict(error_code=code, message=f"the A2A agent answered JSON-RPC error {error.code}: {error.message}")


def _malformed(what: str) -> Verdict:
    return Verdict(error_code=ErrorCode.AGENT_ERROR, message=f"the A2A agent answered a malformed answer: {what}")


def verdict_of(body: bytes) -> Verdict:
    """A SendMessage answer: a message is a result; a task is one once it completed."""
    try:
        reply = _reply_decoder.decode(body)
        if reply.error is not None:
            return _rpc_error(reply.error)
        result = _result(reply.result)
    except msgspec.MsgspecError as exc:  # an answer nested past any need (peer_json.TooDeep) too
        return _malformed(str(exc))
    if result.message is not None:
        return Verdict(result=_joined(result.message.parts))
    if result.task is None:
        return _malformed("neither a task nor a message")
    task = result.task
    ended = _ended(task.status, _task_result(task) or msgspec.Raw(b"null"))
    return ended or Verdict(error_code=ErrorCode.AGENT_ERROR,
                            message=f"the A2A agent answered before its task ended ({state_of(task.status.state)})")


def _task_id(result: _Result) -> str:
    for event in (result.task, result.status_update, result.artifact_update):
        if event is not None:
            return event.id if isinstance(event, _Task) else event.task_id
    return ""


def stream_step(name: str, data: bytes, last: msgspec.Raw) -> StreamStep:
    """One event of an A2A stream: the chunks it carries, the verdict when it ends the stream, the task.
    ``last`` is the last chunk so far, the result of a task that completes without an artifact then."""
    try:
        reply = _reply_decoder.decode(data)
        if reply.error is not None:
            return StreamStep([], _rpc_error(reply.error))
        result = _result(reply.result)
    except msgspec.MsgspecError as exc:
        return StreamStep([], _malformed(f"an event is not A2A ({exc})"))
    if name == "error":
        return StreamStep([], _malformed("an error event without a JSON-RPC error"))
    return _step(result, last)._replace(task_id=_task_id(result))


def _step(result: _Result, last: msgspec.Raw) -> StreamStep:
    if result.artifact_update is not None:
        return StreamStep(_values(result.artifact_update.artifact.parts), None)
    if result.message is not None:
        return StreamStep([], Verdict(result=_joined(result.message.parts)))
    if result.status_update is not None:
        return StreamStep([], _ended(result.status_update.status, last))
    if result.task is not None:
        return StreamStep([], _ended(result.task.status, _task_result(result.task) or last))
    return StreamStep([], None)

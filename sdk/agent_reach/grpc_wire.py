"""ATP over gRPC (``protocol: "grpc"``, agent_reach/proto/agent.proto), as the router and the SDK both speak it.

A call is the ``agentreach.v1.Agent`` service's ``Call`` (one answer) or ``CallStream`` (chunks, then the
reply); the ATP headers (request id, signature, trace context, completion URL) travel as gRPC metadata, the
deadline as the gRPC deadline. The router signs the request message's bytes as sent, naming
``GRPC_SIGNED_PATH`` (the service) for every method (the capability is inside the signed bytes). A call the
agent does not answer with a reply ends in a gRPC status; ``STATUS_OF`` and ``CODE_OF`` are the one table
both ends read (docs/protocols.md), and the agent's own ATP code goes with it as the ``x-reach-error-code``
trailer, so the router reads an SDK agent's answer exactly as over HTTP, any other gRPC server's by the table.

Pure conversions only: the gRPC calls themselves are agent_reach/grpc_serving.py's and router/transports/grpc.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
import msgspec
from yarl import URL

from agent_reach.atp import BusinessError, ErrorCode, RequestFrame
from agent_reach.proto.agent_pb2 import BusinessError as WireBusinessError
from agent_reach.proto.agent_pb2 import CallReply, CallRequest, Chunk
from agent_reach.proto.agent_pb2 import Usage as WireUsage
from agent_reach.signing import GRPC_SIGNED_PATH
from agent_reach.usage import Usage

SERVICE = GRPC_SIGNED_PATH.removeprefix("/")
CALL_METHOD = f"{GRPC_SIGNED_PATH}/Call"
STREAM_METHOD = f"{GRPC_SIGNED_PATH}/CallStream"
# The ATP error code an SDK agent's status stands for (a trailer: the table maps every code onto fewer statuses).
ERROR_CODE_TRAILER = "x-reach-error-code"
# Room for the envelope and metadata around a payload, in a message size limit.
ENVELOPE_BYTES = 64 * 1024

# What an agent aborts a call with, for each ATP error code it answers.
STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_FRAME: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_PAYLOAD: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.PAYLOAD_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_CAPABILITY: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.TOTAL_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# What a gRPC status means to the router when no ATP code came with it (any gRPC server's answer).
# UNAVAILABLE is read with whether the call had left (router/transports/grpc.py): before, failing over is safe.
CODE_OF: dict[grpc.StatusCode, ErrorCode] = {
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_PAYLOAD,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCode.INVALID_PAYLOAD,
    grpc.StatusCode.OUT_OF_RANGE: ErrorCode.INVALID_PAYLOAD,
    grpc.StatusCode.NOT_FOUND: ErrorCode.UNKNOWN_CAPABILITY,
    grpc.StatusCode.UNIMPLEMENTED: ErrorCode.UNKNOWN_CAPABILITY,
    grpc.StatusCode.UNAUTHENTICATED: ErrorCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCode.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.BUSY,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.TOTAL_TIMEOUT,
}

_encoder = msgspec.json.Encoder()
# A DNS name or an IPv4 address, or (as yarl gives a bracketed one) an IPv6 address.
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\Z|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\Z")


def parse_target(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as (host, port); ValueError saying what is wrong."""
    try:
        url = URL(f"grpc://{endpoint}")
        port = url.port
    except ValueError as exc:
        raise ValueError(f"{endpoint!r} is not host:port ({exc})") from None
    if not url.raw_host or port is None or f"{url.raw_authority}" != endpoint or url.raw_path not in ("", "/"):
        raise ValueError(f"{endpoint!r} is not host:port")
    if not 0 < port < 65536:
        raise ValueError(f"{endpoint!r}: port {port} is out of range")
    if not _HOST.match(url.raw_host):
        raise ValueError(f"{endpoint!r}: {url.raw_host!r} is no host name or address")
    return url.raw_host, port


def metadata(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """ATP headers as gRPC metadata (whose keys are lower case)."""
    return tuple((name.lower(), value) for name, value in headers.items())


def headers(received: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The text metadata a call came with, by lower-case name (binary ``-bin`` entries are no ATP header)."""
    return {name: value for name, value in received if isinstance(value, str)}


# The router's side: the call out, the answer back as the ATP frame it stands for.

def call_request(frame: RequestFrame) -> bytes:
    return CallRequest(request_id=frame.request_id, capability=frame.capability or "",
                       payload=_encoder.encode(frame.payload), context=_encoder.encode(frame.context)
                       ).SerializeToString()


class _ResponseFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An ATP response frame whose JSON values are passed on as the agent wrote them (the reader checks them)."""

    request_id: str
    status: str
    result: msgspec.Raw = msgspec.Raw(b"null")
    context_update: msgspec.Raw | None = None
    business_error: dict[str, Any] | None = None
    usage: dict[str, int] | None = None


def reply_frame(reply: CallReply) -> bytes:
    """The ATP response frame a reply stands for."""
    business = None
    if reply.HasField("business_error"):
        wire = reply.business_error
        business = {"code": wire.code, "message": wire.message,
                    "details": msgspec.Raw(wire.details) if wire.details else None}
    usage = ({"input_tokens": reply.usage.input_tokens, "output_tokens": reply.usage.output_tokens}
             if reply.HasField("usage") else None)
    return _encoder.encode(_ResponseFrame(
        request_id=reply.request_id, status="error" if business is not None else "success",
        result=msgspec.Raw(reply.result or b"null"),
        context_update=msgspec.Raw(reply.context_update) if reply.context_update else None,
        business_error=business, usage=usage))


class _ChunkEvent(msgspec.Struct):
    request_id: str
    seq: int
    data: msgspec.Raw


def chunk_event(request_id: str, chunk: Chunk) -> bytes:
    """The ATP chunk event a streamed chunk stands for."""
    return _encoder.encode(_ChunkEvent(request_id, chunk.seq, msgspec.Raw(chunk.data or b"null")))


def error_frame(code: str, message: str) -> bytes:
    """The ATP error frame a status stands for."""
    return _encoder.encode({"request_id": "", "error_code": code, "error_message": message})


# The agent's side: the call in as the ATP frame the dispatcher serves, its answer out.

class _RequestFrame(msgspec.Struct, kw_only=True, omit_defaults=True):
    capability: str
    request_id: str
    payload: msgspec.Raw
    context: msgspec.Raw
    timeout_hint: int | None = None
    stream: bool = False


def request_body(request: CallRequest, time_remaining_s: float | None, stream: bool) -> bytes:
    """The ATP request frame a call stands for; its deadline is what is left of the gRPC deadline."""
    hint = max(int(time_remaining_s * 1000), 0) if time_remaining_s is not None else None
    return _encoder.encode(_RequestFrame(capability=request.capability, request_id=request.request_id,
                                         payload=msgspec.Raw(request.payload or b"null"),
                                         context=msgspec.Raw(request.context or b"{}"), timeout_hint=hint,
                                         stream=stream))


class _Answer(msgspec.Struct, kw_only=True):
    """The dispatcher's own answer: a response frame or an error frame (agent_reach/dispatch.py)."""

    request_id: str = ""
    result: msgspec.Raw = msgspec.Raw(b"null")
    context_update: msgspec.Raw = msgspec.Raw(b"null")
    business_error: BusinessError | None = None
    usage: Usage | None = None
    error_code: ErrorCode | None = None
    error_message: str = ""


_answers = msgspec.json.Decoder(_Answer)


class Refusal(msgspec.Struct, frozen=True):
    """A call the agent ends with a status, not a reply."""

    status: grpc.StatusCode
    code: ErrorCode
    message: str


def reply_message(status: int, body: bytes) -> CallReply | Refusal:
    """What the dispatcher's ``Reply`` becomes on the wire: a reply, or the status that ends the call."""
    answer = _answers.decode(body)
    if answer.error_code is not None or status != 200:
        code = answer.error_code or ErrorCode.AGENT_ERROR
        return Refusal(STATUS_OF.get(code, grpc.StatusCode.UNKNOWN), code, answer.error_message)
    reply = CallReply(request_id=answer.request_id, result=bytes(answer.result))
    if bytes(answer.context_update) != b"null":
        reply.context_update = bytes(answer.context_update)
    if answer.business_error is not None:
        business = answer.business_error
        reply.business_error.CopyFrom(WireBusinessError(
            code=business.code, message=business.message,
            details=_encoder.encode(business.details) if business.details is not None else b""))
    if answer.usage is not None:
        reply.usage.CopyFrom(WireUsage(input_tokens=answer.usage.input_tokens,
                                       output_tokens=answer.usage.output_tokens))
    return reply

"""A2A JSON-RPC as it arrives: the method names of both dialects and the shapes of their params.

A2A v1.0 (the official a2a-sdk 1.x) names methods after its gRPC service (``SendMessage``); v0.3 named
them ``message/send``. The params are alike in both (v0.3 adds a ``kind`` to parts and messages, which is
ignored here), so one set of Structs reads both; only answers differ (translate.py renders each).
Unknown members are ignored, as the a2a-sdk's own server does: A2A grows fields between versions.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import msgspec

# JSON-RPC and A2A error codes (a2a.utils.errors.JSON_RPC_ERROR_CODE_MAP).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
# An ATP refusal (auth, an unknown capability...): the ATP code is the ErrorInfo's reason, as on /atp.
ATP_ERROR = -32000
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
CONTENT_TYPE_NOT_SUPPORTED = -32005
# The ErrorInfo reason A2A gives each of its own errors (a2a.utils.errors.A2A_ERROR_MAPPING).
REASONS = {INVALID_REQUEST: "INVALID_REQUEST", METHOD_NOT_FOUND: "METHOD_NOT_FOUND", INVALID_PARAMS: "INVALID_PARAMS",
           TASK_NOT_FOUND: "TASK_NOT_FOUND", TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
           CONTENT_TYPE_NOT_SUPPORTED: "CONTENT_TYPE_NOT_SUPPORTED"}

MAX_PARTS = 64
MAX_ID_CHARS = 256


class Dialect(Enum):
    V1 = "1.0"
    V03 = "0.3"


class Method(Enum):
    SEND = "send"
    STREAM = "stream"
    GET = "get"
    CANCEL = "cancel"


METHODS: dict[str, tuple[Method, Dialect]] = {
    "SendMessage": (Method.SEND, Dialect.V1), "SendStreamingMessage": (Method.STREAM, Dialect.V1),
    "GetTask": (Method.GET, Dialect.V1), "CancelTask": (Method.CANCEL, Dialect.V1),
    "message/send": (Method.SEND, Dialect.V03), "message/stream": (Method.STREAM, Dialect.V03),
    "tasks/get": (Method.GET, Dialect.V03), "tasks/cancel": (Method.CANCEL, Dialect.V03),
}

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]


class Part(msgspec.Struct, kw_only=True):
    """One part of a message: text, structured data, or a file (v1 ``raw``/``url``, v0.3 ``file``)."""

    text: str | None = None
    data: Any = msgspec.UNSET
    raw: str | None = None
    url: str | None = None
    file: Any = None


class Message(msgspec.Struct, kw_only=True, rename="camel"):
    message_id: Id
    parts: Annotated[list[Part], msgspec.Meta(min_length=1, max_length=MAX_PARTS)]
    context_id: Id | None = None
    task_id: Id | None = None
    metadata: dict[str, Any] | None = None


class Configuration(msgspec.Struct, kw_only=True, rename="camel"):
    return_immediately: bool = False
    blocking: bool | None = None  # v0.3: false is v1's returnImmediately


class SendParams(msgspec.Struct, kw_only=True):
    message: Message
    configuration: Configuration | None = None
    metadata: dict[str, Any] | None = None

    @property
    def return_immediately(self) -> bool:
        config = self.configuration
        return config is not None and (config.return_immediately or config.blocking is False)


class TaskRef(msgspec.Struct, kw_only=True):
    id: Id


class Envelope(msgspec.Struct, kw_only=True):
    jsonrpc: str
    method: str
    params: Any = None
    id: str | int | None = None


class RpcError(Exception):
    """A JSON-RPC error to answer; ``reason`` is the ATP error code when the refusal is the mesh's."""

    def __init__(self, code: int, message: str, reason: str | None = None, metadata: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "")
        self.metadata = metadata or {}

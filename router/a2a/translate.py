"""Pure translation between A2A and ATP: message parts to a payload, a call's answer to a task and its events.

Parts to payload: text parts only -> the text (parts joined by a line end); one data part -> its data;
anything else -> ``{"text", "data": [...]}``. File parts are refused (ATP payloads are JSON).
A2A metadata (the request's, else the message's) carries what ATP needs beyond the payload: ``context``
(the ATP context), ``capability`` (on the catalog endpoint), ``version`` and ``timeout_hint``; an A2A
``contextId`` is the context's ``session_id`` unless one is given, so a conversation stays on one instance.
A result becomes one artifact ``result``: a string as a text part, anything else a data part (v0.3 data
parts hold objects only, so there a non-object is ``{"value": ...}``). Chunks of a streamed answer are
artifact updates of the artifact ``stream``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from agent_reach.atp import ErrorCode, ErrorFrame, RequestFrame

from router.a2a.tasks import CANCELED, COMPLETED, FAILED, REJECTED, TaskEntry
from router.a2a.wire import (
    ATP_ERROR,
    CONTENT_TYPE_NOT_SUPPORTED,
    INVALID_PARAMS,
    Dialect,
    Part,
    RpcError,
    SendParams,
)

# The ATP refusals of a caller's call (it never reached an agent): a JSON-RPC error, or a rejected task.
REFUSALS = frozenset({ErrorCode.INVALID_FRAME, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.UNKNOWN_CAPABILITY,
                      ErrorCode.UNAUTHENTICATED, ErrorCode.FORBIDDEN, ErrorCode.TRUST_LEVEL_INSUFFICIENT,
                      ErrorCode.VERSION_UNSATISFIABLE, ErrorCode.INTENT_AMBIGUOUS, ErrorCode.INTENT_UNMATCHED})
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
DOMAIN = "agentreach"
RESULT_ARTIFACT, STREAM_ARTIFACT = "result", "stream"
_encoder = msgspec.json.Encoder()


def payload_of(parts: list[Part]) -> Any:
    texts: list[str] = []
    data: list[Any] = []
    for index, part in enumerate(parts):
        if part.raw is not None or part.url is not None or part.file is not None:
            raise RpcError(CONTENT_TYPE_NOT_SUPPORTED, f"message.parts[{index}] is a file: the mesh carries "
                                                       "JSON payloads, send text or data parts")
        if part.text is not None:
            texts.append(part.text)
        elif part.data is not msgspec.UNSET:
            data.append(part.data)
        else:
            raise RpcError(INVALID_PARAMS, f"message.parts[{index}] has neither text nor data",
                           metadata={"field": f"message.parts[{index}]"})
    if not data:
        return "\n".join(texts)
    if not texts and len(data) == 1:
        return data[0]
    return {"text": "\n".join(texts), "data": data}


def _metadata(params: SendParams) -> dict[str, Any]:
    return params.metadata if params.metadata is not None else params.message.metadata or {}


def _typed(metadata: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = metadata.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise RpcError(INVALID_PARAMS, f"metadata.{key} has the wrong type", metadata={"field": f"metadata.{key}"})
    return value


def frame_of(params: SendParams, capability: str | None, context_id: str) -> RequestFrame:
    """The ATP request an A2A message asks for (checked as any frame by the API afterwards)."""
    metadata = _metadata(params)
    context = dict(_typed(metadata, "context", dict) or {})
    context.setdefault("session_id", context_id)
    named = _typed(metadata, "capability", str)
    payload = payload_of(params.message.parts)
    frame = RequestFrame(capability=capability or named, payload=payload, context=context,
                         timeout_hint=_typed(metadata, "timeout_hint", int), version=_typed(metadata, "version", str))
    if frame.capability is None:
        frame.intent = payload if isinstance(payload, str) else None
    return frame


def new_context_id(params: SendParams) -> str:
    return params.message.context_id or str(uuid.uuid4())


def refusal_error(frame: ErrorFrame) -> RpcError:
    code = INVALID_PARAMS if frame.error_code is ErrorCode.INVALID_FRAME else ATP_ERROR
    metadata = {"request_id": frame.request_id, "can_retry": str(frame.can_retry).lower()}
    if frame.field is not None:
        metadata["field"] = frame.field
    return RpcError(code, frame.error_message, frame.error_code.value, metadata)


def rpc_error_body(rpc_id: Any, error: RpcError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.reason or error.metadata:
        body["data"] = [{"@type": ERROR_INFO, "reason": error.reason, "domain": DOMAIN,
                         "metadata": error.metadata}]
    return {"jsonrpc": "2.0", "id": rpc_id, "error": body}


def rpc_result(rpc_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def state_name(state: str, dialect: Dialect) -> str:
    return f"TASK_STATE_{state.upper()}" if dialect is Dialect.V1 else state


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def part_of(value: msgspec.Raw, dialect: Dialect) -> dict[str, Any]:
    """A JSON value (as the agent sent it) as a part: a string is text, anything else data."""
    text = bytes(value)
    kind: dict[str, Any] = {} if dialect is Dialect.V1 else {"kind": "text"}
    if text[:1] == b'"':
        return {**kind, "text": msgspec.json.decode(text)}
    if dialect is Dialect.V1:
        return {"data": value}
    return {"kind": "data", "data": value if text[:1] == b"{" else {"value": value}}


def _message(text: str, entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    role = "ROLE_AGENT" if dialect is Dialect.V1 else "agent"
    message = {"messageId": str(uuid.uuid4()), "role": role, "taskId": entry.id, "contextId": entry.context_id,
               "parts": [{"text": text} if dialect is Dialect.V1 else {"kind": "text", "text": text}]}
    return message if dialect is Dialect.V1 else {**message, "kind": "message"}


def status_of(entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state_name(entry.state, dialect), "timestamp": _stamp()}
    if entry.state in (FAILED, REJECTED, CANCELED) and entry.error_message:
        status["message"] = _message(entry.error_message, entry, dialect)
    return status


def metadata_of(entry: TaskEntry) -> dict[str, Any]:
    """The mesh's facts about the call, under ``agentreach``: what an ATP caller reads in the frame."""
    facts: dict[str, Any] = {"request_id": entry.id}
    for name, value in (("capability", entry.capability), ("route", entry.route), ("error_code", entry.error_code),
                        ("context_update", entry.context_update)):
        if value is not None:
            facts[name] = value
    return {"agentreach": facts}


def artifact(artifact_id: str, value: msgspec.Raw, dialect: Dialect) -> dict[str, Any]:
    return {"artifactId": artifact_id, "name": artifact_id, "parts": [part_of(value, dialect)]}


def task_of(entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    task: dict[str, Any] = {"id": entry.id, "contextId": entry.context_id, "status": status_of(entry, dialect),
                            "metadata": metadata_of(entry)}
    if entry.state == COMPLETED and entry.result is not None:
        task["artifacts"] = [artifact(RESULT_ARTIFACT, entry.result, dialect)]
    return task if dialect is Dialect.V1 else {**task, "kind": "task"}


def send_result(entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    """SendMessage's result: v1 wraps the task (``{"task": ...}``), v0.3 answers it bare."""
    task = task_of(entry, dialect)
    return {"task": task} if dialect is Dialect.V1 else task


def task_event(entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    return send_result(entry, dialect)


def artifact_event(entry: TaskEntry, artifact_id: str, value: msgspec.Raw, dialect: Dialect, *, append: bool,
                   last: bool) -> dict[str, Any]:
    event = {"taskId": entry.id, "contextId": entry.context_id, "artifact": artifact(artifact_id, value, dialect),
             "append": append, "lastChunk": last}
    return {"artifactUpdate": event} if dialect is Dialect.V1 else {**event, "kind": "artifact-update"}


def status_event(entry: TaskEntry, dialect: Dialect) -> dict[str, Any]:
    event = {"taskId": entry.id, "contextId": entry.context_id, "status": status_of(entry, dialect),
             "metadata": metadata_of(entry)}
    if dialect is Dialect.V1:
        return {"statusUpdate": event}
    return {**event, "kind": "status-update", "final": entry.final}


def settle(entry: TaskEntry, frame: Any, route: Any) -> None:
    """What the call's final frame says of the task: its state, result or error, and the route."""
    entry.route = route
    if isinstance(frame, ErrorFrame):
        entry.state = REJECTED if frame.error_code in REFUSALS else FAILED
        entry.error_code, entry.error_message = frame.error_code.value, frame.error_message
        return
    entry.state = COMPLETED
    entry.result = msgspec.Raw(_encoder.encode(frame.result))
    entry.context_update = frame.context_update


def cancelled(entry: TaskEntry, why: str) -> None:
    entry.state = CANCELED
    entry.error_message = why

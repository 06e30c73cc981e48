"""Capabilities as MCP tools, and ATP answers as MCP tool results (pure translation, no I/O).

A tool's ``inputSchema`` is the capability's input_schema when that describes an object (MCP tool arguments
are always one); any other declared schema is wrapped as the single argument ``payload``; a capability that
declares none takes any object, which is its payload. ``outputSchema`` is the output_schema when that is an
object's, and then a result that is an object is also the tool result's ``structuredContent``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.atp import ErrorCode, ErrorFrame, ResponseFrame

from router.a2a.card import newest_offer
from router.mirror import Offer

GENERIC_INPUT: dict[str, Any] = {"type": "object", "additionalProperties": True}
WRAPPED = "payload"  # the one argument carrying a payload whose schema is not an object's

_encoder = msgspec.json.Encoder()


def _is_object_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "object"


def tool_of(name: str, offers: list[Offer]) -> dict[str, Any]:
    """The tool for a capability, from its newest registration."""
    capability = newest_offer(offers).capability
    declared = capability.input_schema
    if _is_object_schema(declared):
        input_schema: dict[str, Any] = dict(declared)  # type: ignore[arg-type]
    elif isinstance(declared, dict):
        input_schema = {"type": "object", "properties": {WRAPPED: declared}, "required": [WRAPPED]}
    else:
        input_schema = GENERIC_INPUT
    tool: dict[str, Any] = {"name": name, "description": capability.description or f"The mesh capability {name}",
                            "inputSchema": input_schema, "annotations": {"idempotentHint": capability.idempotent}}
    if _is_object_schema(capability.output_schema):
        tool["outputSchema"] = capability.output_schema
    return tool


def payload_of(arguments: dict[str, Any], offers: list[Offer] | None) -> Any:
    """The ATP payload a tool call's arguments stand for (see tool_of)."""
    if offers is None:
        return arguments
    declared = newest_offer(offers).capability.input_schema
    if isinstance(declared, dict) and not _is_object_schema(declared):
        return arguments.get(WRAPPED)
    return arguments


def _text(value: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value if isinstance(value, str) else _encoder.encode(value).decode()}]


def _meta(frame: ResponseFrame | ErrorFrame) -> dict[str, Any]:
    meta: dict[str, Any] = {"agentreach/request_id": frame.request_id}
    if frame.route is not None and frame.route.instance is not None:
        meta["agentreach/instance"] = frame.route.instance
    return meta


def success(frame: ResponseFrame) -> dict[str, Any]:
    # An agent's answer may be passed on undecoded (msgspec.Raw): decoded here, where its shape matters.
    value = msgspec.json.decode(frame.result) if isinstance(frame.result, msgspec.Raw) else frame.result
    result: dict[str, Any] = {"content": _text(value), "isError": False, "_meta": _meta(frame)}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


def business_failure(frame: ErrorFrame) -> dict[str, Any]:
    """An agent's business error: a tool result with isError, which the model reads (not a protocol error)."""
    error = frame.business_error
    code, message = (error.code, error.message) if error is not None else (frame.error_code.value,
                                                                          frame.error_message)
    meta = _meta(frame)
    if error is not None:
        meta["agentreach/business_error"] = msgspec.to_builtins(error)
    return {"content": _text(f"{code}: {message}" if message else code), "isError": True, "_meta": meta}


def is_business_failure(frame: ErrorFrame) -> bool:
    return frame.error_code is ErrorCode.BUSINESS_ERROR

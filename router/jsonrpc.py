"""JSON-RPC 2.0 over the same /atp endpoint: `atp.call` envelopes, batches and notifications.

Pure translation between envelopes and ATP frames; the API module runs the calls.
"""

from __future__ import annotations

from typing import Any

import msgspec
from agent_reach.atp import ErrorFrame

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
ATP_ERROR = -32000  # an ATP error frame, carried whole in `data`

METHOD = "atp.call"


class Envelope(msgspec.Struct, kw_only=True):
    jsonrpc: str
    method: str
    params: dict[str, Any] = {}  # the request frame; its request_id (else the router's) is the call's id
    # Only echoed, never the request_id: clients number ids 1, 2, 3 in every process, so as the call's
    # identity they would merge unrelated callers' calls.
    id: str | int | None = None
    has_id: bool = False


class RpcError(Exception):
    def __init__(self, code: int, message: str, request_id: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def is_envelope(body: Any) -> bool:
    return isinstance(body, list) or (isinstance(body, dict) and "jsonrpc" in body)


def parse_envelope(item: Any) -> Envelope:
    """Check one envelope; a missing `id` member makes it a notification (no answer)."""
    request_id = item.get("id") if isinstance(item, dict) else None
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0" or not isinstance(item.get("method"), str):
        raise RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 request object", request_id)
    if not isinstance(request_id, (str, int, type(None))) or isinstance(request_id, bool):
        raise RpcError(INVALID_REQUEST, "id must be a string, a number or null", None)
    if item["method"] != METHOD:
        raise RpcError(METHOD_NOT_FOUND, f"Unknown method {item['method']!r}; use {METHOD!r}", request_id)
    params = item.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object: the ATP request frame", request_id)
    return Envelope(jsonrpc="2.0", method=METHOD, params=params, id=request_id, has_id="id" in item)


def answer(request_id: Any, frame: msgspec.Struct) -> dict[str, Any]:
    """The JSON-RPC answer carrying a response frame (as ``result``) or an error frame (in ``error``)."""
    if isinstance(frame, ErrorFrame):
        return error_answer(request_id, ATP_ERROR, frame.error_message, frame)
    return {"jsonrpc": "2.0", "id": request_id, "result": frame}


def error_answer(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}

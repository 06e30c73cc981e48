"""OpenAPI 3.1 documents built from a declared table of operations.

Each operation names the msgspec types its handler decodes its body with and encodes its answers from, so
the schemas come from the same Structs (``msgspec.json.schema_components``) and cannot drift from what the
handlers read. Every error status is declared with what it answers: the one error envelope (weblayer/errors.py)
unless the operation names another (an ATP call's error frame, an OAuth error, a JSON-RPC error).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from weblayer.responses import json_response

REF_TEMPLATE = "#/components/schemas/{name}"
VERSION = "0.1.0"  # pyproject.toml's
# The credentials, as a client sends them: the same key in either header (bearer also carries a router's JWT).
API_KEY = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
BEARER = {"type": "http", "scheme": "bearer"}
_PATH_PARAMETER = re.compile(r"{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::[^{}]*)?}")
_REASONS = {
    200: "OK",
    201: "Created",
    204: "No content",
    400: "The request is not valid (the field is named)",
    401: "No credential, or not a valid one",
    403: "The credential may not do this",
    404: "No such thing",
    405: "Method not allowed",
    408: "The body arrived too slowly",
    409: "Conflict with what is stored",
    413: "The body is too large",
    415: "Unsupported media type",
    429: "Too many requests",
    431: "Request headers too large",
    502: "An upstream failed",
    503: "Unavailable now; retry later",
    504: "An upstream timed out",
}


class ErrorBody(msgspec.Struct):
    """The error envelope every part of the mesh answers (agent_reach.connections.error_body); some errors
    add details beside these three (a 409's stored policy)."""

    error: str
    message: str
    field: str | None


@dataclasses.dataclass(frozen=True)
class Body:
    """A body that is not a Struct: its media type, and a JSON schema (permissive when none is given)."""

    description: str
    media_type: str = "application/json"
    schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# What an operation answers with a status: a type msgspec describes, a Body, a tuple of those (any one of
# them, all JSON), or None (no body).
Answer = Any


@dataclasses.dataclass(frozen=True)
class Operation:
    """One (method, path) a service serves; ``security`` names schemes of which any one is enough (empty: open)."""

    method: str
    path: str
    summary: str
    answers: Mapping[int, Answer]
    request: Answer = None
    request_required: bool = True
    # The types path parameters are held to (any string when not named).
    path_types: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    errors: Sequence[int] = ()
    security: Sequence[str] = ()
    parameters: Sequence[Mapping[str, Any]] = ()
    tags: Sequence[str] = ()
    # What its errors answer (the error envelope when None): a call's are ATP error frames.
    error_answer: Answer = None
    # Request bodies by name, for readers and as the first cases a fuzzer sends.
    examples: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def query(
    name: str, description: str, schema: Mapping[str, Any] | None = None, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": dict(schema or {"type": "string"}),
    }


def header(name: str, description: str, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": dict(schema or {"type": "string"}),
    }


def openapi_path(path: str) -> str:
    """aiohttp's ``/x/{tail:.+}`` as OpenAPI's ``/x/{tail}``."""
    return _PATH_PARAMETER.sub(lambda match: "{" + match.group("name") + "}", path)


def _alternatives(answer: Answer) -> tuple[Any, ...]:
    return answer if isinstance(answer, tuple) else (answer,)


def _struct_types(operations: Iterable[Operation]) -> list[Any]:
    kinds: list[Any] = [ErrorBody]
    for operation in operations:
        for answer in (operation.request, operation.error_answer, *operation.answers.values()):
            for kind in _alternatives(answer):
                if kind is not None and not isinstance(kind, Body) and kind not in kinds:
                    kinds.append(kind)
    return kinds


def _schema(answer: Answer, schemas: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    if isinstance(answer, tuple):
        return {"anyOf": [_schema(kind, schemas) for kind in answer]}
    if isinstance(answer, Body):
        return {"description": answer.description, **answer.schema}
    return schemas[answer]


def _content(answer: Answer, schemas: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    media_type = answer.media_type if isinstance(answer, Body) else "application/json"
    return {media_type: {"schema": _schema(answer, schemas)}}


def _path_schema(kind: Any) -> dict[str, Any]:
    return {"type": "string"} if kind is None else msgspec.json.schema(kind)


def _operation(operation: Operation, schemas: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, answer in operation.answers.items():
        response: dict[str, Any] = {"description": _REASONS.get(status, "Answer")}
        if answer is not None:
            response["content"] = _content(answer, schemas)
        responses[str(status)] = response
    errors = set(operation.errors)
    if operation.request is not None:
        errors |= {400, 413}
    if operation.security:
        errors |= {401, 403}
    for status in sorted(errors - operation.answers.keys()):
        responses[str(status)] = {
            "description": _REASONS.get(status, "Error"),
            "content": _content(operation.error_answer or ErrorBody, schemas),
        }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _path_schema(operation.path_types.get(name))}
        for name in _PATH_PARAMETER.findall(operation.path)
    ]
    described: dict[str, Any] = {
        "summary": operation.summary,
        "operationId": f"{operation.method.lower()}{openapi_path(operation.path)}",
        "parameters": [*parameters, *operation.parameters],
        "responses": responses,
        "security": [{name: []} for name in operation.security],
    }
    if operation.tags:
        described["tags"] = list(operation.tags)
    if operation.request is not None:
        content = _content(operation.request, schemas)
        if operation.examples:
            for media in content.values():
                media["examples"] = {name: {"value": value} for name, value in operation.examples.items()}
        described["requestBody"] = {"required": operation.request_required, "content": content}
    return described


def document(
    title: str,
    description: str,
    operations: Sequence[Operation],
    security_schemes: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``: every Struct they name under #/components/schemas."""
    kinds = _struct_types(operations)
    refs, components = msgspec.json.schema_components(kinds, ref_template=REF_TEMPLATE)
    schemas = dict(zip(kinds, refs, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(openapi_path(operation.path), {})[operation.method.lower()] = _operation(operation, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": VERSION, "description": description},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": dict(security_schemes)},
    }


OPENAPI_JSON = "/openapi.json"


def self_description() -> Operation:
    """GET /openapi.json itself, open on every service."""
    return Operation(
        "GET",
        OPENAPI_JSON,
        "This OpenAPI 3.1 document",
        {200: Body("OpenAPI 3.1", schema={"type": "object", "required": ["openapi", "paths"]})},
    )


def handler(spec: Mapping[str, Any]) -> Handler:
    """GET /openapi.json: the document, encoded once."""
    encoded = msgspec.json.encode(spec)

    async def serve(request: web.Request) -> web.Response:
        return json_response(msgspec.Raw(encoded))

    return serve

"""Integers the registry stores are bounded (found by fuzzing its OpenAPI document): its log encodes at most
64-bit integers, so a bigger one that a body's Struct let through was answered 500 when written, after the
decode had accepted it. Now the decode refuses it, 400 naming the field."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from conftest import call
from registry.openapi import registry_document
from registry.server import RegistryServer

BEYOND_64_BITS = 10**30


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/settings/alerts", {"min_failures": BEYOND_64_BITS}, "min_failures"),
        ("/policies/echo", {"circuit_breaker": {"min_requests": BEYOND_64_BITS}}, "circuit_breaker.min_requests"),
    ],
)
async def test_a_bigger_integer_is_refused_naming_the_field(
    registry: RegistryServer, http: aiohttp.ClientSession, path: str, body: dict[str, Any], field: str
) -> None:
    status, answer = await call(http, "PUT", f"{registry.url}{path}", body=body)
    assert (status, answer["error"], answer["field"]) == (400, "invalid_field", field), answer


def unbounded_integers(schema: dict[str, Any], components: dict[str, Any], at: str, seen: frozenset[str]) -> list[str]:
    """Where in ``schema`` an integer has no maximum (following $refs once each)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return [] if name in seen else unbounded_integers(components[name], components, at, seen | {name})
    found = [at] if "integer" in schema.get("type", ()) and "maximum" not in schema else []
    for alternative in schema.get("anyOf", []):
        found += unbounded_integers(alternative, components, at, seen)
    for name, field in schema.get("properties", {}).items():
        found += unbounded_integers(field, components, f"{at}.{name}", seen)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += unbounded_integers(schema[key], components, f"{at}[]", seen)
    return found


def test_every_integer_a_registry_body_carries_is_bounded() -> None:
    """What the registry decodes it may store: every integer in its request bodies has a maximum."""
    spec = registry_document(True)
    components = spec["components"]["schemas"]
    found = [
        where
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        for media, content in operation.get("requestBody", {}).get("content", {}).items()
        if media == "application/json"
        for where in unbounded_integers(content["schema"], components, f"{method.upper()} {path}", frozenset())
    ]
    assert found == []

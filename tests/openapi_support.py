"""What the OpenAPI tests share: a service's document checked against its app's route table and validated as
OpenAPI 3.1, and schemathesis run against the running service, bounded in examples and time.

schemathesis is synchronous (requests): it runs in a worker thread while the test's event loop serves the
service it calls."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import hypothesis
import schemathesis
from aiohttp import web
from hypothesis import strategies
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from weblayer.openapi import OPENAPI_JSON, openapi_path

# Per operation: enough to reach every answer of a small API, few enough for three services well under 2 min
# (AGENTREACH_FUZZ_EXAMPLES=200 for a deeper run by hand: the time box grows with it).
MAX_EXAMPLES = int(os.environ.get("AGENTREACH_FUZZ_EXAMPLES", "12"))
# Each service's whole run stops starting new operations past this.
TIME_BOX = 30.0 * max(1, MAX_EXAMPLES // 12)
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]
# schemathesis leaves out the operation that served it the document; served_document checks that one.
SELF = ("GET", OPENAPI_JSON)
# Who fuzzes an operation: the headers its requests carry (its credential), None to leave it out.
Credentials = Callable[[str, str, list[str]], Mapping[str, str] | None]


def served(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, as OpenAPI names the path; HEAD (aiohttp's beside GET),
    static files and a catch-all left out."""
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        if route.method == "HEAD" or "directory" in info or info.get("formatter") == "/{path}":
            continue
        assert route.resource is not None
        routes.add((route.method, openapi_path(route.resource.canonical)))
    return routes


def declared(spec: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item}


async def served_document(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """GET /openapi.json without a credential, validated as OpenAPI 3.1."""
    async with http.get(f"{url}{OPENAPI_JSON}") as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "application/json"
        spec: dict[str, Any] = await response.json()
    assert spec["openapi"].startswith("3.1.")
    validate(spec, cls=OpenAPIV31SpecValidator)
    return spec


def _fuzz_operation(operation: Any, url: str, headers: dict[str, str], mode: GenerationMode) -> None:
    """Its documented examples first (positive only), then generated cases."""
    examples = operation.schema.get_strategies_from_examples(operation) if mode is GenerationMode.POSITIVE else []

    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.given(case=strategies.one_of(*examples, operation.as_strategy(generation_mode=mode)))
    def check(case: Any) -> None:
        case.call_and_validate(base_url=url, headers=headers, timeout=10, checks=CHECKS)

    check()


def _fuzz(url: str, credentials: Credentials) -> tuple[list[str], set[tuple[str, str]]]:
    schema = schemathesis.openapi.from_url(f"{url}{OPENAPI_JSON}")
    failures: list[str] = []
    deadline = time.monotonic() + TIME_BOX
    fuzzed: set[tuple[str, str]] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        security = [name for requirement in operation.definition.raw.get("security", []) for name in requirement]
        headers = credentials(operation.method.upper(), operation.path, security)
        if headers is None or time.monotonic() > deadline:
            continue
        fuzzed.add((operation.method.upper(), operation.path))
        # Negative cases need something to get wrong: a parameter or a body.
        raw = operation.definition.raw
        modes = list(GenerationMode) if raw.get("parameters") or "requestBody" in raw else [GenerationMode.POSITIVE]
        for mode in modes:
            try:
                _fuzz_operation(operation, url, dict(headers), mode)
            except Exception as exc:  # every operation's failure is reported, not only the first
                failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {exc}")
    return failures, fuzzed


async def fuzz(url: str, credentials: Credentials) -> set[tuple[str, str]]:
    """schemathesis against the service at ``url``: no 5xx, every answer matching its schema. Returns the
    operations it fuzzed (all within the time box)."""
    failures, fuzzed = await asyncio.to_thread(_fuzz, url, credentials)
    assert not failures, "\n\n".join(failures)
    return fuzzed

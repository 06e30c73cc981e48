"""Whole numbers in query strings (found by fuzzing the OpenAPI documents): a number is ASCII digits, and a
short run of them. `str.isdigit` also holds for '²', which int() refuses, and int() refuses over 4300 digits:
both were answered 500 instead of 400 naming the parameter."""

from __future__ import annotations

import aiohttp
import pytest

from conftest import call
from registry.server import RegistryServer
from router_support import Mesh

NOT_NUMBERS = ["²", "1" * 5000, "٣"]


@pytest.mark.parametrize("raw", NOT_NUMBERS)
async def test_the_registry_refuses_them_naming_the_parameter(
    registry: RegistryServer, http: aiohttp.ClientSession, raw: str
) -> None:
    for path, name in (("/budgets", "limit"), ("/watch", "since")):
        status, body = await call(http, "GET", f"{registry.url}{path}?{name}={raw}")
        assert (status, body["error"], body["field"]) == (400, "invalid_field", name), (path, body)


@pytest.mark.parametrize("raw", NOT_NUMBERS)
async def test_the_router_refuses_them_naming_the_parameter(mesh: Mesh, http: aiohttp.ClientSession, raw: str) -> None:
    status, body = await call(http, "GET", f"{mesh.url}/traces?limit={raw}")
    assert (status, body["error"], body["field"]) == (400, "invalid_field", "limit"), body


async def test_a_number_still_counts(registry: RegistryServer, http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "GET", f"{registry.url}/budgets?limit=1")
    assert (status, body["next_after"]) == (200, None)

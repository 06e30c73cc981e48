"""The shared web layer on a real server: every failure a handler lets out is answered in the one error
envelope (raised errors with their headers, a part's translated failures, aiohttp's own 404/405/413,
bodies that do not decode, bugs), refusals are logged, and the admin-only guard lets through only what
its check accepts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
import pytest
from agent_reach.serving import listen
from aiohttp import web

from weblayer.errors import ApiError
from weblayer.guard import admin_only
from weblayer.middleware import errors_as_json
from weblayer.reading import bounded_int, converted, read_json
from weblayer.responses import json_response

log = logging.getLogger("agentreach.test.weblayer")


def envelope(code: str, message: str, field: str | None = None) -> dict[str, str | None]:
    """The error body as docs/atp.md and the README spell it."""
    return {"error": code, "message": message, "field": field}


class Outage(Exception):
    """A part's own failure with a meaning, as the registry's storage outage."""


Colour = Annotated[str, msgspec.Meta(pattern="^[a-z]+$")]


class Item(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    sizes: list[int] = []


def outage(exc: Exception) -> ApiError | None:
    return ApiError(503, "storage_unavailable", f"cannot store: {exc}") if isinstance(exc, Outage) else None


async def refused(request: web.Request) -> web.Response:
    raise ApiError(403, "forbidden", "not yours", "Authorization", headers={"X-Why": "test"}, owner="someone")


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("a bug with a secret in it")


async def out_of_storage(request: web.Request) -> web.Response:
    raise Outage("disk full")


async def item(request: web.Request) -> web.Response:
    return json_response(await read_json(request, Item), 201)


async def coloured(request: web.Request) -> web.Response:
    return json_response({"colour": converted(request.match_info["colour"], Colour, "colour")})


async def page(request: web.Request) -> web.Response:
    return json_response({"limit": bounded_int(request, "limit", 50, 1, 100)})


async def only_with_key(request: web.Request) -> ApiError | None:
    if request.headers.get("X-Key") == "admin":
        return None
    return ApiError(401, "unauthenticated", "send the key", "X-Key")


async def secret(request: web.Request) -> web.Response:
    return json_response({"secret": 42})


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[str]:
    app = web.Application(middlewares=[errors_as_json("test part", log, outage)], client_max_size=1024)
    for method, path, handler in (("POST", "/refused", refused), ("GET", "/broken", broken),
                                  ("POST", "/outage", out_of_storage), ("POST", "/items", item),
                                  ("GET", "/colours/{colour}", coloured),
                                  ("GET", "/page", page), ("GET", "/secret", admin_only(secret, only_with_key))):
        app.router.add_route(method, path, handler)
    runner, port = await listen(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serving() as base:
        yield base


async def answer(http, method: str, url: str, **options) -> tuple[int, dict, object]:
    async with http.request(method, url, **options) as response:
        assert response.content_type == "application/json"
        return response.status, dict(response.headers), await response.json()


async def test_a_raised_error_is_its_envelope_with_its_details_and_headers_and_a_refusal_is_logged(url, http, caplog):
    with caplog.at_level(logging.WARNING, logger=log.name):
        status, headers, body = await answer(http, "POST", f"{url}/refused")
    assert status == 403 and headers["X-Why"] == "test"
    assert body == {**envelope("forbidden", "not yours", "Authorization"), "owner": "someone"}
    refusals = [record for record in caplog.records if record.getMessage() == "request refused"]
    assert [(r.path, r.error) for r in refusals] == [("/refused", "forbidden")]


async def test_a_bug_is_a_plain_500_naming_the_part_and_logged_with_its_traceback(url, http, caplog):
    with caplog.at_level(logging.ERROR, logger=log.name):
        status, _, body = await answer(http, "GET", f"{url}/broken")
    assert (status, body) == (500, envelope("internal_error", "The test part failed to handle this request"))
    [record] = [record for record in caplog.records if record.getMessage() == "unhandled error"]
    assert record.exc_info is not None and "secret" in str(record.exc_info[1])


async def test_a_translated_failure_is_answered_as_the_part_says(url, http):
    status, _, body = await answer(http, "POST", f"{url}/outage")
    assert (status, body) == (503, envelope("storage_unavailable", "cannot store: disk full"))


@pytest.mark.parametrize(("method", "path", "options", "status", "code"), [
    ("GET", "/nowhere", {}, 404, "not_found"),
    ("GET", "/items", {}, 405, "method_not_allowed"),
    ("POST", "/items", {"data": b"[" * 2048}, 413, "payload_too_large"),
])
async def test_aiohttp_s_own_refusals_are_in_the_envelope(url, http, method, path, options, status, code):
    got_status, _, body = await answer(http, method, f"{url}{path}", **options)
    assert (got_status, body["error"]) == (status, code) and body["message"] and body["field"] is None


@pytest.mark.parametrize(("sent", "code", "field"), [
    (b'{"name": "a", "sizes": [1, "two"]}', "invalid_field", "sizes[1]"),
    (b'{"name": "a", "colour": "red"}', "unknown_field", "colour"),
    (b'{"sizes": []}', "missing_field", "name"),
    (b'{"name": ', "invalid_json", None),
])
async def test_a_body_that_is_not_the_struct_is_a_400_naming_the_field(url, http, sent, code, field):
    status, _, body = await answer(http, "POST", f"{url}/items", data=sent)
    assert (status, body["error"], body["field"]) == (400, code, field) and body["message"]


async def test_a_body_that_is_the_struct_reaches_the_handler(url, http):
    status, _, body = await answer(http, "POST", f"{url}/items", json={"name": "a", "sizes": [1, 2]})
    assert (status, body) == (201, {"name": "a", "sizes": [1, 2]})


async def test_a_path_value_is_held_to_its_type_under_its_name(url, http):
    assert (await answer(http, "GET", f"{url}/colours/red"))[::2] == (200, {"colour": "red"})
    status, _, body = await answer(http, "GET", f"{url}/colours/Red")
    assert (status, body["error"], body["field"]) == (400, "invalid_field", "colour")


async def test_the_admin_only_guard_answers_its_check_s_refusal_and_passes_the_rest(url, http):
    status, _, body = await answer(http, "GET", f"{url}/secret")
    assert (status, body) == (401, envelope("unauthenticated", "send the key", "X-Key"))
    status, _, body = await answer(http, "GET", f"{url}/secret", headers={"X-Key": "admin"})
    assert (status, body) == (200, {"secret": 42})


@pytest.mark.parametrize(("query", "answered"), [("", 50), ("?limit=1", 1), ("?limit=100", 100)])
async def test_a_bounded_query_number_is_its_default_or_what_was_sent(url, http, query, answered):
    assert (await answer(http, "GET", f"{url}/page{query}"))[::2] == (200, {"limit": answered})


@pytest.mark.parametrize("sent", ["0", "101", "-1", "1.5", "ten", ""])
async def test_a_bounded_query_number_out_of_its_range_is_a_400_naming_it(url, http, sent):
    status, _, body = await answer(http, "GET", f"{url}/page?limit={sent}")
    assert (status, body) == (400, envelope("invalid_field", "limit must be a whole number from 1 to 100", "limit"))

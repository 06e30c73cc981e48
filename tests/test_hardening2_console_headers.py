"""Issue 25 item 6 over HTTP: every kind of answer the console gives (the page, its static files, the
JSON API, the event stream, sign-in, refusals and errors, health and metrics) carries the strict
Content-Security-Policy, nosniff, no-referrer and DENY framing; the router's and the registry's JSON
answers carry nosniff. Against a real mesh and console on 127.0.0.1."""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDictProxy

from console_support import Rig

# The policy the console must hold to: no inline script, no eval, no inline style, nothing from
# elsewhere, no plugins, no <base> rewriting, forms only to itself, never framed.
REQUIRED_DIRECTIVES = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}


def directives(policy: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *sources = part.split()
        assert name not in parsed, f"{name} given twice in {policy!r}"
        parsed[name] = sources
    return parsed


def assert_hardened(headers: CIMultiDictProxy[str], what: str) -> None:
    for name in ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options"):
        assert len(headers.getall(name, [])) == 1, f"{what}: {name} sent {headers.getall(name, [])}"
    assert directives(headers["Content-Security-Policy"]) == REQUIRED_DIRECTIVES, what
    assert headers["X-Content-Type-Options"] == "nosniff", what
    assert headers["Referrer-Policy"] == "no-referrer", what
    assert headers["X-Frame-Options"] == "DENY", what


async def answer(http: aiohttp.ClientSession, method: str, url: str,
                 **options) -> tuple[int, CIMultiDictProxy[str]]:
    async with http.request(method, url, allow_redirects=False, **options) as response:
        await response.read()
        return response.status, response.headers


# (method, path, request options, expected status): one of each kind of answer, auth on and signed out.
SIGNED_OUT = [
    ("GET", "/", {}, 200),  # the page shell (the sign-in form is drawn in it)
    ("HEAD", "/", {}, 200),
    ("GET", "/static/app.js", {}, 200),
    ("GET", "/static/console.css", {}, 200),
    ("GET", "/static/lib/signin.js", {}, 200),
    ("GET", "/static/no-such-file.js", {}, 404),
    ("GET", "/api/session", {}, 200),
    ("POST", "/api/session", {"json": {"admin_key": "ara_wrong"}}, 401),
    ("POST", "/api/session", {"data": b"{not json"}, 400),
    ("POST", "/api/session", {"json": {"admin_key": "x"}, "headers": {"Origin": "http://127.0.0.1:1"}}, 403),
    ("DELETE", "/api/session", {}, 200),
    ("GET", "/api/overview", {}, 401),
    ("GET", "/api/stream?topics=overview", {}, 401),
    ("GET", "/healthz", {}, 200),
    ("GET", "/metrics", {}, 200),
    ("GET", "/no/such/page", {}, 401),
]
SIGNED_IN = [
    ("GET", "/api/config", {}, 200),
    ("GET", "/api/agents", {}, 200),
    ("GET", "/api/agents/no-such-agent", {}, 404),  # relayed from the registry as it came
    ("GET", "/api/traces?limit=nope", {}, 400),
    ("POST", "/api/debug", {"data": b"{}"}, 200),  # the router's refusal, reported
    ("PATCH", "/api/config", {}, 405),
    ("GET", "/api/no-such-endpoint", {}, 404),
    ("POST", "/api/session", {}, 200),
]


async def test_every_kind_of_console_answer_carries_the_security_headers(auth_rig: Rig, http):
    url, key = auth_rig.url, {"X-API-Key": auth_rig.admin_key}
    for method, path, options, status in SIGNED_OUT:
        got, headers = await answer(http, method, f"{url}{path}", **options)
        assert got == status, (method, path, got)
        assert_hardened(headers, f"{method} {path} signed out")
    for method, path, options, status in SIGNED_IN:
        sent = {"json": {"admin_key": auth_rig.admin_key}} if path == "/api/session" else options
        got, headers = await answer(http, method, f"{url}{path}", headers=key, **sent)
        assert got == status, (method, path, got)
        assert_hardened(headers, f"{method} {path} signed in")


async def test_the_event_stream_and_a_revalidated_static_file_carry_them_too(auth_rig: Rig, http):
    url, key = auth_rig.url, {"X-API-Key": auth_rig.admin_key}
    async with http.get(f"{url}/api/stream?topics=overview", headers=key) as stream:
        assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
        assert_hardened(stream.headers, "the event stream")
    status, first = await answer(http, "GET", f"{url}/static/app.js")
    assert status == 200 and "Last-Modified" in first
    status, headers = await answer(http, "GET", f"{url}/static/app.js",
                                   headers={"If-Modified-Since": first["Last-Modified"]})
    assert status == 304
    assert_hardened(headers, "a static file not modified")


async def test_with_auth_off_the_pages_and_api_carry_them(rig: Rig, http):
    for path, status in (("/", 200), ("/api/overview", 200), ("/api/policies/none", 405), ("/nowhere", 404)):
        got, headers = await answer(http, "GET", f"{rig.url}{path}")
        assert got == status, (path, got)
        assert_hardened(headers, f"GET {path} auth off")


async def test_the_router_and_registry_json_answers_say_nosniff(rig: Rig, http):
    mesh = rig.mesh
    for url, status in ((f"{mesh.registry.url}/agents", 200), (f"{mesh.registry.url}/agents/nobody", 404),
                        (f"{mesh.url}/traces", 200), (f"{mesh.url}/traces/nothing-here", 404)):
        got, headers = await answer(http, "GET", url)
        assert got == status, (url, got)
        assert headers["Content-Type"].startswith("application/json"), url
        assert headers.getall("X-Content-Type-Options", []) == ["nosniff"], url
    async with http.post(f"{mesh.url}/atp", json={"capability": "nobody.offers", "payload": {}}) as response:
        assert response.status >= 400 and response.headers.getall("X-Content-Type-Options", []) == ["nosniff"]

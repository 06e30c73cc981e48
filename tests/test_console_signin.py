"""The console with auth on: its API refuses anyone without the admin key, a browser signs in with
it (an HttpOnly session cookie) and out again, and the console reaches an auth-on registry and
router with the key. Against a real mesh and, for the sign-in form, headless chromium."""

from __future__ import annotations

import aiohttp
import pytest
from playwright.async_api import expect

from console.server import ConsoleServer, ConsoleSettings
from console.signin import COOKIE
from console_support import Rig, screenshot

WAIT_MS = 10_000


async def fetch(http: aiohttp.ClientSession, method: str, url: str, **options) -> tuple[int, dict, object]:
    async with http.request(method, url, **options) as response:
        return response.status, dict(response.headers), await response.json()


async def test_the_api_needs_the_admin_key_the_page_shell_does_not(auth_rig: Rig, http):
    url = auth_rig.url
    for path in ("/api/overview", "/api/config", "/api/agents", "/api/policies", "/api/stream?topics=overview"):
        status, headers, body = await fetch(http, "GET", f"{url}{path}")
        assert status == 401, path
        assert body["error"] == "unauthenticated" and body["field"] == "Authorization" and body["message"]
        assert headers["X-Console-Sign-In"] == "required"
    status, _, body = await fetch(http, "PUT", f"{url}/api/settings/alerts", json={"reach_threshold": 0.5})
    assert status == 401 and body["error"] == "unauthenticated"
    status, _, _ = await fetch(http, "GET", f"{url}/api/overview", headers={"X-API-Key": "ara_not-the-key"})
    assert status == 401
    for credential in ({"X-API-Key": auth_rig.admin_key}, {"Authorization": f"Bearer {auth_rig.admin_key}"}):
        status, _, _ = await fetch(http, "GET", f"{url}/api/overview", headers=credential)
        assert status == 200
    status, _, body = await fetch(http, "GET", f"{url}/api/session")
    assert (status, body) == (200, {"auth": "on", "signed_in": False})
    for path in ("/", "/static/app.js", "/static/lib/signin.js"):
        async with http.get(f"{url}{path}") as response:
            assert response.status == 200, path


async def test_sign_in_gives_a_session_cookie_not_the_key_and_sign_out_ends_it(auth_rig: Rig):
    url = auth_rig.url
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser_like:
        status, _, body = await fetch(browser_like, "POST", f"{url}/api/session", json={"admin_key": "ara_wrong"})
        assert status == 401 and body["field"] == "admin_key" and "not the admin key" in body["message"]
        status, _, body = await fetch(browser_like, "POST", f"{url}/api/session", data=b"{not json")
        assert status == 400 and body["field"] == "admin_key"
        status, _, body = await fetch(browser_like, "POST", f"{url}/api/session",
                                      headers={"Origin": "http://127.0.0.1:1"}, json={"admin_key": auth_rig.admin_key})
        assert status == 403 and body["field"] == "Origin"

        async with browser_like.post(f"{url}/api/session", json={"admin_key": auth_rig.admin_key}) as response:
            assert response.status == 200
            cookie = response.cookies[COOKIE]
            assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
            assert auth_rig.admin_key not in response.headers["Set-Cookie"]
        status, _, body = await fetch(browser_like, "GET", f"{url}/api/session")
        assert body == {"auth": "on", "signed_in": True}
        status, _, _ = await fetch(browser_like, "GET", f"{url}/api/overview")
        assert status == 200
        # A change carrying the cookie from another origin (an agent's page on another port) is refused.
        status, _, _ = await fetch(browser_like, "PUT", f"{url}/api/settings/alerts",
                                   headers={"Origin": "http://127.0.0.1:1"}, json={"reach_threshold": 0.9})
        assert status == 401
        status, _, saved = await fetch(browser_like, "PUT", f"{url}/api/settings/alerts",
                                       headers={"Origin": url}, json={"reach_threshold": 0.9})
        assert status == 200 and saved["reach_threshold"] == 0.9

        status, _, body = await fetch(browser_like, "DELETE", f"{url}/api/session")
        assert (status, body) == (200, {"auth": "on", "signed_in": False})
        assert COOKIE not in {cookie.key for cookie in browser_like.cookie_jar}
        status, _, _ = await fetch(browser_like, "GET", f"{url}/api/overview",
                                   cookies={COOKIE: cookie.value})  # the old session id is dead too
        assert status == 401


async def test_the_console_reads_and_changes_an_auth_on_mesh_with_the_admin_key(auth_rig: Rig, start_agent):
    registry = auth_rig.mesh.registry
    await auth_rig.mesh.add(await start_agent("a1"))
    overview = await auth_rig.until("/api/overview", lambda o: o["available_instances"] == 1 and o["router"]["ok"],
                                    "the console to read the registry and router with the key")
    assert overview["registry"]["ok"] and overview["traces"]["ok"]
    [row] = (await auth_rig.get("/api/agents"))["agents"]
    assert row["agent_id"] == "a1"
    assert (await auth_rig.get("/api/agents/a1"))["agent"]["agent_id"] == "a1"
    status, saved = await auth_rig.request("PUT", "/api/policies/echo", {"policy": "hash"})
    assert status == 200 and saved["policy"] == "hash"
    assert registry.registry.state.policies["echo"].policy == "hash"
    status, saved = await auth_rig.request("PUT", "/api/settings/alerts", {"reach_threshold": 0.95})
    assert status == 200 and registry.registry.state.alerts.reach_threshold == 0.95
    for path in ("/api/alerts", "/api/traces", "/api/settings/alerts", "/api/reach"):
        await auth_rig.get(path)


async def test_the_debug_entry_calls_as_the_caller_whose_key_it_is_given(auth_rig: Rig, start_agent, http):
    await auth_rig.mesh.add(await start_agent("a1"))
    caller = await auth_rig.mesh.new_client(["echo"], name="debugger")
    frame = b'{"capability": "echo", "payload": {"text": "hi"}}'
    headers = {"X-API-Key": auth_rig.admin_key}
    status, _, result = await fetch(http, "POST", f"{auth_rig.url}/api/debug", data=frame,
                                    headers={**headers, "X-Reach-Caller-Key": caller["api_key"]})
    assert status == 200 and result["http_status"] == 200
    assert result["frame"]["result"] == {"echo": {"text": "hi"}, "agent": "a1"}
    # Without a caller key the console does not lend the router its admin key: the router refuses.
    status, _, result = await fetch(http, "POST", f"{auth_rig.url}/api/debug", data=frame, headers=headers)
    assert status == 200 and result["http_status"] == 401 and result["frame"]["error_code"] == "UNAUTHENTICATED"


async def test_a_console_with_auth_on_and_no_admin_key_does_not_start(tmp_path):
    console = ConsoleServer(ConsoleSettings(port=0, data_dir=tmp_path, auth="on"))
    with pytest.raises(ValueError, match="needs the admin key"):
        await console.start()
    await console.stop()


async def test_signing_in_and_out_in_the_browser(auth_rig: Rig, page):
    await page.goto(f"{auth_rig.url}/#/")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await expect(page.locator(".sidenav")).to_be_hidden()
    await expect(page.locator("#auth-banner")).to_be_hidden()
    key = page.get_by_label("Admin key")
    await key.fill("ara_not-the-key")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".field-error")).to_contain_text("That is not the admin key")
    await expect(key).to_have_attribute("aria-invalid", "true")
    await screenshot(page, "signin-refused")

    await key.fill(auth_rig.admin_key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("main h1")).to_have_text("Overview", timeout=WAIT_MS)
    await expect(page.locator("#up-registry")).to_have_attribute("data-ok", "yes", timeout=WAIT_MS)
    await expect(page.locator("#up-router")).to_have_attribute("data-ok", "yes", timeout=WAIT_MS)
    await expect(page.locator("#auth-banner")).to_be_hidden()
    cookies = await page.context.cookies()
    assert [c["httpOnly"] for c in cookies if c["name"] == COOKIE] == [True]
    assert auth_rig.admin_key not in await page.evaluate("document.cookie + JSON.stringify(sessionStorage)")
    await screenshot(page, "signed-in")

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
    status, _, _ = await fetch(auth_rig.http, "GET", f"{auth_rig.url}/api/overview",
                               cookies={COOKIE: cookies[0]["value"]})
    assert status == 401


async def test_with_auth_off_the_browser_needs_no_key_and_shows_the_banner(rig: Rig, page):
    await page.goto(f"{rig.url}/#/")
    await expect(page.locator("main h1")).to_have_text("Overview", timeout=WAIT_MS)
    await expect(page.locator("#auth-banner")).to_contain_text("Authentication off")
    await expect(page.locator("#sign-out")).to_be_hidden()
    await expect(page.get_by_role("heading", name="Sign in")).to_have_count(0)

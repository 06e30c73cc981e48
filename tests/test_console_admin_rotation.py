"""The console follows `agentreach admin-key rotate`: the new key opens it, the old key and the
sessions opened with it stop working, and the console's own calls to the mesh carry the new key.
Against a real auth-on registry and router."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from conftest import wait_for
from console.signin import COOKIE
from registry.access import admin_key_path
from router_support import Mesh


async def status_of(http: aiohttp.ClientSession, url: str, **options) -> int:
    async with http.get(url, **options) as response:
        return response.status


async def sign_in(url: str, key: str) -> str:
    async with aiohttp.ClientSession() as browser_like, \
            browser_like.post(f"{url}/api/session", json={"admin_key": key}) as response:
        assert response.status == 200
        return response.cookies[COOKIE].value


async def rotate(mesh: Mesh, http: aiohttp.ClientSession) -> str:
    async with http.post(f"{mesh.registry.url}/admin-key/rotate", headers={"X-API-Key": mesh.admin_key}) as response:
        assert response.status == 200
        return (await response.json())["admin_key"]


async def refuses_key(http: aiohttp.ClientSession, url: str, key: str) -> None:
    async def refused() -> bool:
        return await status_of(http, f"{url}/api/overview", headers={"X-API-Key": key}) == 401
    await wait_for(refused, timeout=10, what="the console to refuse the old key")


async def polled_after(http: aiohttp.ClientSession, url: str, key: str, moment: float) -> dict:
    """The console's overview once it has read registry and router successfully after ``moment``."""
    async def fresh() -> dict | None:
        async with http.get(f"{url}/api/overview", headers={"X-API-Key": key}) as response:
            if response.status != 200:
                return None
            overview = await response.json()
        upstreams = (overview["registry"], overview["router"])
        return overview if all(part["ok"] and part["checked_at"] > moment for part in upstreams) else None
    return await wait_for(fresh, timeout=10, what="the console to read the mesh with the new key")


async def test_after_a_rotation_the_console_takes_the_new_key_and_drops_the_old(start_mesh, start_console, start_agent,
                                                                                 http):
    mesh = await start_mesh(auth=True)
    await mesh.add(await start_agent("a1"))
    old = mesh.admin_key
    # As in `agentreach up`: the console reads admin.key from the registry's data dir.
    console = await start_console(mesh.registry.url, mesh.url, data_dir=mesh.registry.settings.data_dir, auth="on",
                                  admin_key=old)
    old_session = await sign_in(console.url, old)
    assert await status_of(http, f"{console.url}/api/overview", cookies={COOKIE: old_session}) == 200

    rotated_at = time.time()
    new = await rotate(mesh, http)
    assert admin_key_path(mesh.registry.settings.data_dir).read_text().strip() == new

    await refuses_key(http, console.url, old)
    assert await status_of(http, f"{console.url}/api/overview", cookies={COOKIE: old_session}) == 401
    async with http.post(f"{console.url}/api/session", json={"admin_key": old}) as response:
        assert response.status == 401
    assert await status_of(http, f"{console.url}/api/overview", headers={"X-API-Key": new}) == 200
    new_session = await sign_in(console.url, new)
    assert await status_of(http, f"{console.url}/api/overview", cookies={COOKIE: new_session}) == 200

    overview = await polled_after(http, console.url, new, rotated_at)
    assert overview["available_instances"] == 1
    for path in ("/api/agents/a1", "/api/policies", "/api/settings/alerts", "/api/traces", "/api/alerts"):
        assert await status_of(http, f"{console.url}{path}", headers={"X-API-Key": new}) == 200, path


async def test_a_console_given_the_key_elsewhere_learns_the_new_one_from_the_operator(start_mesh, start_console, http,
                                                                                       tmp_path: Path):
    """A console apart from the registry's data dir (key by --admin-key or $AGENTREACH_ADMIN_KEY)
    cannot re-read the file: it stops honouring the refused key, and the first operator who signs
    in with the key the registry accepts gives it the new one."""
    mesh = await start_mesh(auth=True)
    old = mesh.admin_key
    console = await start_console(mesh.registry.url, mesh.url, data_dir=tmp_path / "elsewhere", auth="on",
                                  admin_key=old)
    old_session = await sign_in(console.url, old)
    rotated_at = time.time()
    new = await rotate(mesh, http)
    await refuses_key(http, console.url, old)
    assert await status_of(http, f"{console.url}/api/overview", cookies={COOKIE: old_session}) == 401

    new_session = await sign_in(console.url, new)
    assert await status_of(http, f"{console.url}/api/overview", cookies={COOKIE: new_session}) == 200
    await polled_after(http, console.url, new, rotated_at)
    async with http.post(f"{console.url}/api/session", json={"admin_key": "ara_" + "x" * 43}) as response:
        assert response.status == 401

"""A console on top of a real mesh (registry + router from router_support), and a headless browser.

The console polls fast here (every 0.2 s) so tests wait for conditions, never for time. The
browser is Debian's chromium driven by Playwright, launched by path: nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import wait_for
from console.server import ConsoleServer, ConsoleSettings
from router_support import Mesh, StartMesh

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
POLL = 0.2


class Rig:
    """A mesh and a console watching it, with a client for the console's API."""

    def __init__(self, mesh: Mesh, console: ConsoleServer, http: aiohttp.ClientSession,
                 admin_key: str | None = None):
        self.mesh = mesh
        self.console = console
        self.http = http
        self.admin_key = admin_key  # sent as X-API-Key on every request when the console has auth on

    @property
    def url(self) -> str:
        return self.console.url

    async def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.admin_key is not None:
            headers["X-API-Key"] = self.admin_key
        async with self.http.request(method, f"{self.url}{path}", data=data, headers=headers) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def get(self, path: str) -> Any:
        status, body = await self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    async def until(self, path: str, check: Callable[[Any], Any], what: str, timeout: float = 10.0) -> Any:
        """GET ``path`` until ``check(body)`` holds; returns that body."""
        async def fetched() -> Any:
            body = await self.get(path)
            return body if check(body) else None
        return await wait_for(fetched, timeout=timeout, interval=0.05, what=what)


StartRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def start_console(tmp_path: Path,
                        http: aiohttp.ClientSession) -> AsyncIterator[Callable[..., Awaitable[ConsoleServer]]]:
    """Start consoles against given registry and router URLs (auth off unless asked); each stops at teardown."""
    consoles: list[ConsoleServer] = []

    async def start(registry_url: str, router_url: str, data_dir: Path | None = None, auth: str = "off",
                    admin_key: str | None = None) -> ConsoleServer:
        console = ConsoleServer(ConsoleSettings(port=0, registry_url=registry_url, router_url=router_url,
                                                data_dir=data_dir or tmp_path / "console", poll_interval=POLL,
                                                auth=auth, admin_key=admin_key))
        await console.start()
        consoles.append(console)
        return console

    yield start
    for console in consoles:
        await console.stop()


@pytest.fixture
async def start_rig(start_mesh: StartMesh, start_console: Callable[..., Awaitable[ConsoleServer]],
                    http: aiohttp.ClientSession) -> StartRig:
    """A mesh (router knobs and lifecycle as for start_mesh) and a console watching it."""

    async def start(data_dir: Path | None = None, **mesh_options: Any) -> Rig:
        mesh = await start_mesh(**mesh_options)
        console = await start_console(mesh.registry.url, mesh.url, data_dir)
        return Rig(mesh, console, http)

    return start


@pytest.fixture
async def rig(start_rig: StartRig) -> Rig:
    return await start_rig()


@pytest.fixture
async def auth_rig(start_mesh: StartMesh, start_console: Callable[..., Awaitable[ConsoleServer]],
                   http: aiohttp.ClientSession) -> Rig:
    """Everything with auth on: the registry made the admin key, the console signs in with it."""
    mesh = await start_mesh(auth=True)
    assert mesh.admin_key is not None
    console = await start_console(mesh.registry.url, mesh.url, auth="on", admin_key=mesh.admin_key)
    return Rig(mesh, console, http, mesh.admin_key)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Headless chromium (scripts/install-test-tools installs it). One per test: Playwright's objects
    belong to the event loop that made them, and each test has its own loop."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-test-tools (as root)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    """A fresh laptop-sized page; any script error in it fails the test."""
    context = await browser.new_context(viewport={"width": 1440, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    await context.close()
    assert not errors, f"script errors in the page: {errors}"


async def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path

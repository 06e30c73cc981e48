"""The `agentreach` command's security side, end to end: the admin key made on first start and
reused after, `clients` and `tokens` against a real registry, `router` following an auth-on
registry with the data dir's admin key, and `--auth off` / AGENTREACH_AUTH=off warned about."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from agentreach.demo import DEMO_SERVICES, demo_credentials
from conftest import registration, wait_for
from router_support import capability
from sdk_support import free_port, refused_url
from storage_support import AGENTREACH, ROOT


def environment(auth: str | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "AGENTREACH_AUTH"}
    if auth is not None:
        env["AGENTREACH_AUTH"] = auth
    return env


async def agentreach(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the command in a thread, so registries served by this test's event loop keep answering."""
    return await asyncio.to_thread(subprocess.run, [*AGENTREACH, *args], capture_output=True, text=True, cwd=cwd,
                                   env={**(env or environment()), "PYTHONPATH": _pythonpath()}, timeout=60)


def _pythonpath() -> str:
    """This checkout first, then whatever path the tests run with (a worktree's own SDK, say)."""
    return os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


async def admin(*args: str, registry: Any, **options: Any) -> Any:
    """An admin command against ``registry`` with its data dir's admin key; its JSON answer."""
    result = await agentreach(*args, "--registry", registry.url, "--data-dir", str(registry.settings.data_dir),
                              **options)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


class Process:
    """A long-running `agentreach` process whose stderr is read line by line into ``lines``."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.popen = subprocess.Popen([*AGENTREACH, *args], stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                      env=env or environment())
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def plain(self) -> list[str]:
        return [line for line in list(self.lines) if not line.startswith("{")]

    async def logged(self, event: str, timeout: float = 20) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            assert self.popen.poll() is None, f"exited with {self.popen.returncode}: {self.lines}"
            return next((e for e in self.events() if e["event"] == event), None)
        return await wait_for(found, timeout=timeout, interval=0.05, what=event)

    async def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
        assert await asyncio.to_thread(self.popen.wait, 20) == 0, self.lines


async def test_first_start_creates_the_admin_key_shows_it_once_and_reuses_it(tmp_path, http):
    data_dir = tmp_path / "data"
    first = Process("registry", "--port", "0", "--data-dir", str(data_dir))
    try:
        url = (await first.logged("registry listening"))["url"]
        key_file = data_dir / "admin.key"
        key = key_file.read_text().strip()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        shown = first.plain()
        assert any(str(key_file) in line and "shown once" in line for line in shown), shown
        assert sum(key in line for line in shown) == 1
        async with http.get(f"{url}/clients", headers={"X-API-Key": key}) as response:
            assert response.status == 200
        async with http.get(f"{url}/clients") as response:
            assert response.status == 401
    finally:
        await first.stop()
    assert not any(key in line for line in first.lines if line.startswith("{")), "the admin key reached a log line"

    second = Process("registry", "--port", "0", "--data-dir", str(data_dir))
    try:
        url = (await second.logged("registry listening"))["url"]
        assert key_file.read_text().strip() == key
        assert not any(key in line for line in second.lines)
        assert not any("admin key" in line for line in second.plain())
        async with http.get(f"{url}/clients", headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status == 200
    finally:
        await second.stop()


async def test_clients_created_listed_disabled_enabled_and_rotated(start_registry):
    registry = await start_registry(auth=True)
    book = registry.registry.state.auth
    created = await admin("clients", "create", "--name", "orders-app", "--trust", "user_authorized",
                          "--grant", "order.*", "--grant", "intent.detect", "--rate-limit", "5", registry=registry)
    assert created["client_secret"].startswith("arc_") and created["api_key"].startswith("ark_")
    assert (created["name"], created["trust_level"], created["grants"]) == (
        "orders-app", "user_authorized", ["order.*", "intent.detect"])
    client_id = created["client_id"]
    assert book.client_by_api_key(created["api_key"]).client_id == client_id

    listed = await agentreach("clients", "list", "--registry", registry.url, "--data-dir",
                              str(registry.settings.data_dir))
    [shown] = json.loads(listed.stdout)["clients"]
    assert shown["client_id"] == client_id and shown["enabled"] and shown["rate_limit_qps"] == 5
    assert created["client_secret"] not in listed.stdout and created["api_key"] not in listed.stdout
    assert "digest" not in listed.stdout

    assert (await admin("clients", "disable", client_id, registry=registry))["enabled"] is False
    assert book.client_by_api_key(created["api_key"]) is None
    assert (await admin("clients", "enable", client_id, registry=registry))["enabled"] is True
    assert book.client_by_api_key(created["api_key"]) is not None

    rotated = await admin("clients", "rotate", client_id, registry=registry)
    assert rotated["client_id"] == client_id
    assert rotated["api_key"] != created["api_key"] and rotated["client_secret"] != created["client_secret"]
    assert book.client_by_api_key(created["api_key"]) is None
    assert book.client_by_api_key(rotated["api_key"]).client_id == client_id


async def test_tokens_created_listed_and_revoked(start_registry, http):
    registry = await start_registry(auth=True)
    issued = await admin("tokens", "create", "--service", "billing", registry=registry)
    assert issued["token"].startswith("art_") and issued["service"] == "billing" and issued["token_id"]
    bearer = {"Authorization": f"Bearer {issued['token']}"}
    async with http.post(f"{registry.url}/register", json=registration("b1", "bill.pay", service="billing"),
                         headers=bearer) as response:
        assert response.status == 200, await response.text()

    listed = await agentreach("tokens", "list", "--registry", registry.url, "--data-dir",
                              str(registry.settings.data_dir))
    assert json.loads(listed.stdout)["tokens"] == [
        {"token_id": issued["token_id"], "service": "billing", "created_at": issued["created_at"], "revoked": False}]
    assert issued["token"] not in listed.stdout

    revoked = await admin("tokens", "revoke", issued["token_id"], registry=registry)
    assert revoked["revoked"] is True
    async with http.post(f"{registry.url}/register", json=registration("b2", "bill.pay", service="billing"),
                         headers=bearer) as response:
        assert response.status == 401


async def test_the_admin_key_is_rotated_at_once_on_disk_and_in_the_log(start_registry, http, tmp_path):
    data = tmp_path / "rotating"
    registry = await start_registry(data_dir=data, auth=True)
    old = registry.new_admin_key
    rotated = await admin("admin-key", "rotate", registry=registry)
    new = rotated["admin_key"]
    assert new.startswith("ara_") and new != old and rotated["stored_in"] == str(data / "admin.key")
    assert (data / "admin.key").read_text().strip() == new
    assert stat.S_IMODE((data / "admin.key").stat().st_mode) == 0o600
    for key, status in ((old, 401), (new, 200)):
        async with http.get(f"{registry.url}/agents", headers={"X-API-Key": key}) as response:
            assert response.status == status
    await registry.stop()
    again = await start_registry(data_dir=data, auth=True)
    assert again.new_admin_key is None and again.registry.state.auth.is_admin(new)
    assert not again.registry.state.auth.is_admin(old)


async def test_the_admin_key_defaults_to_the_local_data_dirs(start_registry, tmp_path):
    registry = await start_registry(tmp_path / "work" / ".agentreach", auth=True)
    result = await agentreach("tokens", "create", "--service", "svc", "--registry", registry.url,
                              cwd=tmp_path / "work")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["service"] == "svc"
    key = (tmp_path / "work" / ".agentreach" / "admin.key").read_text().strip()
    elsewhere = await agentreach("tokens", "list", "--registry", registry.url, "--admin-key", key, cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr


@pytest.mark.parametrize(("args", "code", "says"), [
    (("clients", "disable", "cli_nobody"), 1, "404 client_not_found: No client 'cli_nobody' (field: client_id)"),
    (("clients", "create", "--name", "x", "--trust", "internal", "--grant", "*"), 1, "400"),
    (("tokens", "create", "--service", "svc", "--admin-key", "ara_wrong"), 1, "401 unauthenticated"),
    (("clients", "create", "--name", "x", "--trust", "root", "--grant", "a"), 2, "invalid choice: 'root'"),
    (("clients", "create", "--name", "x", "--trust", "public", "--grant", "a", "--rate-limit", "0"), 2,
     "--rate-limit must be greater than 0"),
    (("clients", "create", "--name", "x", "--trust", "public"), 2, "--grant"),
])
async def test_a_refused_or_malformed_command_says_why_on_one_line(start_registry, args, code, says):
    registry = await start_registry(auth=True)
    result = await agentreach(*args, "--registry", registry.url, "--data-dir", str(registry.settings.data_dir))
    assert result.returncode == code
    assert result.stdout == ""
    assert says in result.stderr and "Traceback" not in result.stderr
    if code == 1:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("agentreach: the registry refused")


async def test_an_unreachable_registry_or_a_missing_admin_key_fails_cleanly(tmp_path):
    down = refused_url()
    unreachable = await agentreach("clients", "list", "--registry", down, "--admin-key", "ara_x")
    assert unreachable.returncode == 1 and unreachable.stdout == ""
    assert unreachable.stderr.startswith(f"agentreach: cannot reach the registry at {down}")
    assert unreachable.stderr.count("\n") == 1 and "Traceback" not in unreachable.stderr
    keyless = await agentreach("tokens", "list", "--data-dir", str(tmp_path / "empty"))
    assert keyless.returncode == 2
    assert "no admin key" in keyless.stderr and str(tmp_path / "empty" / "admin.key") in keyless.stderr


async def test_router_follows_an_auth_on_registry_with_the_data_dirs_admin_key(start_registry, start_agent, http):
    registry = await start_registry(auth=True)
    admin_key = (registry.settings.data_dir / "admin.key").read_text().strip()
    agent = await start_agent("billing-1")
    async with http.post(f"{registry.url}/register", headers={"X-API-Key": admin_key}, json={
            "agent_id": "billing-1", "service": "billing", "metadata": {},
            "capabilities": [capability("bill.pay", agent.endpoint)]}) as response:
        assert response.status == 200, await response.text()
    caller = await admin("clients", "create", "--name", "payer", "--trust", "internal", "--grant", "bill.pay",
                         registry=registry)
    port = free_port()
    router = Process("router", "--port", str(port), "--registry", registry.url, "--data-dir",
                     str(registry.settings.data_dir), "--log-level", "info")
    try:
        await router.logged("router listening")

        async def routed() -> dict[str, Any] | None:
            async with http.post(f"http://127.0.0.1:{port}/atp", headers={"X-API-Key": caller["api_key"]},
                                 json={"capability": "bill.pay", "payload": {"n": 1}}) as response:
                return await response.json() if response.status == 200 else None

        answer = await wait_for(routed, timeout=10, what="the router to learn bill.pay from /watch")
        assert answer["result"]["agent"] == "billing-1"
    finally:
        await router.stop()


async def test_router_and_console_with_auth_on_refuse_to_start_without_the_admin_key(tmp_path):
    for command in (("router", "--port", str(free_port())), ("console", "--port", str(free_port()))):
        result = await agentreach(*command, "--data-dir", str(tmp_path / "nothing"))
        assert result.returncode == 2, (command, result.stderr)
        assert f"`{command[0]}` with auth on needs the registry's admin key" in result.stderr
        assert "Traceback" not in result.stderr


async def test_auth_off_from_the_environment_is_warned_about_and_the_flag_wins(tmp_path, http):
    data_dir = tmp_path / "dev"
    dev = Process("registry", "--port", "0", "--data-dir", str(data_dir), env=environment(auth="off"))
    try:
        url = (await dev.logged("registry listening"))["url"]
        assert any("WARNING: authentication is OFF" in line for line in dev.plain()), dev.lines
        warned = next(e for e in dev.events() if e["event"] == "authentication is off (development only)")
        assert warned["level"] == "warning" and warned["command"] == "registry"
        async with http.get(f"{url}/agents") as response:
            assert response.status == 200
        assert not (data_dir / "admin.key").exists()
    finally:
        await dev.stop()

    flagged = Process("registry", "--port", "0", "--data-dir", str(data_dir), "--auth", "on",
                      env=environment(auth="off"))
    try:
        url = (await flagged.logged("registry listening"))["url"]
        assert (data_dir / "admin.key").exists()
        assert not any("authentication is OFF" in line for line in flagged.lines)
        async with http.get(f"{url}/agents") as response:
            assert response.status == 401
    finally:
        await flagged.stop()


async def test_up_with_auth_off_opens_the_console_with_its_banner_state(tmp_path, http):
    ports = {name: free_port() for name in ("registry", "router", "console")}
    up = Process("up", "--auth", "off", "--data-dir", str(tmp_path / "up"), "--registry-port", str(ports["registry"]),
                 "--router-port", str(ports["router"]), "--console-port", str(ports["console"]))
    try:
        await up.logged("console listening")
        assert any("WARNING: authentication is OFF for `up`" in line for line in up.plain())
        async with http.get(f"http://127.0.0.1:{ports['console']}/api/session") as response:
            assert await response.json() == {"auth": "off", "signed_in": True}
        async with http.get(f"http://127.0.0.1:{ports['console']}/api/overview") as response:
            assert response.status == 200
        assert not (tmp_path / "up" / "admin.key").exists()
    finally:
        await up.stop()


async def test_demo_credentials_are_reused_across_starts_and_replaced_when_lost(start_registry):
    registry = await start_registry(auth=True)
    data_dir, book = registry.settings.data_dir, registry.registry.state.auth
    first = await demo_credentials(registry.registry, data_dir)
    assert {book.token(token).service for token in first.tokens.values()} == set(DEMO_SERVICES)
    assert book.client_by_api_key(first.orders_api_key).grants == ["intent.detect"]
    caller_key = first.caller_key_path.read_text().strip()
    assert book.client_by_api_key(caller_key).name == "demo-caller"
    assert stat.S_IMODE(first.caller_key_path.stat().st_mode) == 0o600
    assert caller_key not in first.banner("http://127.0.0.1:8080")

    again = await demo_credentials(registry.registry, data_dir)
    assert again == first and len(book.tokens) == 3 and len(book.clients) == 2

    first.caller_key_path.unlink()
    replaced = await demo_credentials(registry.registry, data_dir)
    new_key = replaced.caller_key_path.read_text().strip()
    assert new_key != caller_key and book.client_by_api_key(caller_key) is None
    assert book.client_by_api_key(new_key).name == "demo-caller" and len(book.clients) == 2

"""The `agentreach` command: help for every subcommand, flag validation, and `wal inspect`."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import post, registration, wait_for
from sdk_support import free_port
from storage_support import AGENTREACH, ROOT, agentreach


@pytest.mark.parametrize(("command", "expected"), [
    ((), "up"),
    (("up",), "--registry-port"),
    (("registry",), "--silence-timeout"),
    (("wal",), "inspect"),
    (("wal", "inspect"), "data_dir"),
    (("router",), "--admin-key"),
    (("console",), "--auth {on,off}"),
    (("clients",), "rotate"),
    (("clients", "create"), "--grant"),
    (("tokens", "create"), "--service"),
])
def test_every_command_has_help(command, expected):
    result = agentreach(*command, "--help")
    assert result.returncode == 0
    assert expected in result.stdout


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_bad_knob_is_refused_with_a_message(value):
    result = agentreach("registry", "--silence-timeout", value)
    assert result.returncode == 2
    assert "--silence-timeout must be a finite number greater than 0" in result.stderr


async def test_wal_inspect_reports_a_real_log(start_registry, http, tmp_path):
    data_dir = tmp_path / "inspected"
    server = await start_registry(data_dir)
    for i in range(5):
        await post(http, f"{server.url}/register", registration(f"a{i}", f"cap.{i}"))
    await server.stop()
    result = agentreach("wal", "inspect", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert "00000000000000000001" in result.stdout
    assert "5" in result.stdout


def test_wal_inspect_of_a_missing_dir_fails_cleanly(tmp_path):
    result = agentreach("wal", "inspect", str(tmp_path / "nothing-here"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


async def test_up_demo_starts_a_live_mesh_to_call_at_once(tmp_path, http):
    """With auth on (the default): the demo agents register with their tokens, and the demo
    caller's key (kept in DATA_DIR/demo/) calls through the router."""
    registry_port, router_port, console_port = free_port(), free_port(), free_port()
    data_dir = tmp_path / "demo"
    process = subprocess.Popen(
        [*AGENTREACH, "up", "--demo", "--data-dir", str(data_dir),
         "--registry-port", str(registry_port), "--router-port", str(router_port),
         "--console-port", str(console_port), "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, "AGENTREACH_AUTH": "on"})
    try:
        async def healthy() -> bool:
            admin = (data_dir / "admin.key").read_text().strip() if (data_dir / "admin.key").exists() else ""
            try:
                async with http.get(f"http://127.0.0.1:{registry_port}/agents",
                                    headers={"X-API-Key": admin}) as response:
                    agents = (await response.json())["agents"]
            except OSError:
                return False
            return sorted((a["agent_id"], a["state"]) for a in agents) == [
                ("demo-echo-01", "healthy"), ("demo-intent-01", "healthy"), ("demo-orders-01", "healthy")]

        await wait_for(healthy, timeout=20, what="three healthy demo agents")
        frame = {"capability": "order.query", "payload": {"text": "where is my order A-1002"}}
        caller = {"X-API-Key": (data_dir / "demo" / "demo-caller.key").read_text().strip()}

        async def answered() -> dict | None:
            async with http.post(f"http://127.0.0.1:{router_port}/atp", json=frame, headers=caller) as response:
                return await response.json() if response.status == 200 else None

        answer = await wait_for(answered, timeout=5, what="the router to route order.query")
        assert answer["result"] == {"order_id": "A-1002", "status": "packing"}
        async def console_up() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{console_port}/api/overview",
                                    headers={"X-API-Key": (data_dir / "admin.key").read_text().strip()}) as response:
                    return response.status == 200
            except OSError:
                return False

        await wait_for(console_up, timeout=10, what="the console to answer")
    finally:
        process.terminate()
        assert process.wait(20) == 0

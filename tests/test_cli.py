"""The `agentreach` command: help for every subcommand, flag validation, and `wal inspect`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import post, registration

ROOT = Path(__file__).resolve().parents[1]


def agentreach(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


@pytest.mark.parametrize("command,expected", [
    ((), "up"),
    (("up",), "--registry-port"),
    (("registry",), "--silence-timeout"),
    (("wal",), "inspect"),
    (("wal", "inspect"), "data_dir"),
])
def test_every_command_has_help(command, expected):
    result = agentreach(*command, "--help")
    assert result.returncode == 0
    assert expected in result.stdout


def test_bad_knob_is_refused_with_a_message():
    result = agentreach("registry", "--silence-timeout", "0")
    assert result.returncode == 2
    assert "--silence-timeout must be greater than 0" in result.stderr


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

"""`agentreach router --max-answer-bytes N`: the limit on an agent's answer is the operator's to set."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from router_support import capability
from sdk_support import read_log_until

ROOT = Path(__file__).resolve().parents[1]


async def test_the_router_command_cuts_answers_off_at_max_answer_bytes(start_registry, start_agent, http, tmp_path):
    registry = await start_registry(silence_timeout=30.0, health_interval=30.0, evict_after=3)
    agent = await start_agent("wordy-1")
    body = {"agent_id": agent.name, "service": "echo", "capabilities": [capability("echo", agent.endpoint)]}
    async with http.post(f"{registry.url}/register", json=body) as response:
        assert response.status == 200, await response.text()
    async with http.post(f"{registry.url}/heartbeat", json={"agent_id": agent.name}) as response:
        assert response.status == 200, await response.text()
    router = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentreach.cli", "router", "--port", "0", "--registry", registry.url, "--auth", "off",
        "--no-audit", "--data-dir", str(tmp_path / "router"), "--max-answer-bytes", "200", cwd=ROOT,
        stderr=asyncio.subprocess.PIPE)
    try:
        url = (await read_log_until(router, "router listening"))["url"]

        async def synced() -> bool:
            async with http.get(f"{url}/healthz") as response:
                return (await response.json())["capabilities"] == 1
        await wait_for(synced, timeout=10, what="the router to learn of echo")

        async def call(text: str) -> tuple[int, dict]:
            async with http.post(f"{url}/atp", json={"capability": "echo", "payload": text}) as response:
                return response.status, await response.json()

        status, answer = await call("short")  # {"echo": "short", "agent": "wordy-1"}: well under 200 bytes
        assert status == 200 and answer["result"]["echo"] == "short", answer
        status, answer = await call("x" * 300)
        assert (status, answer["error_code"]) == (502, "ANSWER_TOO_LARGE"), answer
        assert "200 bytes" in answer["error_message"]
    finally:
        router.terminate()
        await router.communicate()


@pytest.mark.parametrize("command", ["up", "router"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_answer_bytes_must_be_positive(command, value):
    refused = subprocess.run([sys.executable, "-m", "agentreach.cli", command, "--max-answer-bytes", value],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "--max-answer-bytes must be a finite number greater than 0" in refused.stderr

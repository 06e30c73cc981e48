"""The examples a newcomer runs, run as they would run them: child processes on loopback."""

from __future__ import annotations

import asyncio
import difflib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from conftest import wait_for
from doc_support import ROOT, DocMesh, doc_environment, doc_mesh, python_process, venv_commands
from sdk_support import (
    EXAMPLES,
    agent_view,
    free_port,
    post_frame,
    read_log_until,
    refused_url,
    spawn_example,
    wait_state,
)

README = ROOT / "README.md"


def test_the_seed_example_changes_fewer_than_30_lines():
    before = (EXAMPLES / "intent_fastapi_before.py").read_text().splitlines()
    after = (EXAMPLES / "intent_fastapi_after.py").read_text().splitlines()
    changed = [line for line in difflib.unified_diff(before, after, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) < 30, "\n".join(changed)


async def test_echo_agent_drains_and_deregisters_on_sigterm_and_caller_reaches_it(registry, http):
    agent = await spawn_example("echo_agent.py", "--registry", registry.url, "--port", "0",
                                "--agent-id", "echo-proc-1", "--heartbeat-interval", "0.2")
    try:
        listening = await read_log_until(agent, "agent listening")
        await wait_state(http, registry.url, "echo-proc-1", "healthy")

        # The caller script, with the router down, reaches the agent directly through the registry.
        caller = await spawn_example("caller.py", "demo.echo", '{"text": "hi"}', "--router",
                                     refused_url(), "--registry", registry.url)
        out, _ = await asyncio.wait_for(caller.communicate(), 20)
        printed = json.loads(out)
        assert caller.returncode == 0 and printed["result"]["echo"] == {"text": "hi"}
        assert printed["route"]["degraded"] is True and printed["route"]["instance"] == "echo-proc-1"

        endpoint = f"{listening['base_url']}/atp/demo.echo"
        slow = asyncio.create_task(post_frame(http, endpoint, {"payload": {"delay_s": 1.0}}))
        await wait_for(lambda: _inflight_is(http, registry.url, 1), what="slow call in flight")
        agent.send_signal(signal.SIGTERM)
        await wait_for(lambda: _gone(http, registry.url), what="deregistered")
        assert not slow.done()
        status, answer = await slow
        assert status == 200 and answer["result"]["echo"] == {"delay_s": 1.0}
        assert await asyncio.wait_for(agent.wait(), 10) == 0
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


async def _inflight_is(http, registry_url, count):
    return (await agent_view(http, registry_url, "echo-proc-1"))["inflight"] == count


async def _gone(http, registry_url):
    return await agent_view(http, registry_url, "echo-proc-1") is None


# Against the default `agentreach up` (auth on), with credentials in the environment the README names.

def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


async def exported(commands: str, cwd: Path, mesh: DocMesh, names: tuple[str, ...]) -> dict[str, str]:
    """Run shell lines that export variables (with the venv's `agentreach`); the values they set."""
    script = f"{venv_commands(mesh.on_our_ports(commands))}\n" + \
        "".join(f'printf "%s\\n" "${name}"\n' for name in names)
    result = await asyncio.to_thread(subprocess.run, ["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                                     text=True, timeout=60, cwd=cwd, env=doc_environment(mesh))
    assert result.returncode == 0, result.stderr
    values = result.stdout.split()
    assert len(values) == len(names) and all(values), result.stdout + result.stderr
    return dict(zip(names, values, strict=False))


async def agent_state(http, mesh: DocMesh, cwd: Path, agent_id: str) -> str | None:
    key = (cwd / ".agentreach" / "admin.key").read_text().strip()
    async with http.get(f"{mesh.registry_url}/agents/{agent_id}", headers={"X-API-Key": key}) as response:
        return (await response.json())["state"] if response.status == 200 else None


async def healthy(http, mesh: DocMesh, cwd: Path, agent_id: str, process: subprocess.Popen) -> None:
    async def reached() -> bool:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        return await agent_state(http, mesh, cwd, agent_id) == "healthy"
    await wait_for(reached, timeout=20, what=f"{agent_id} to be healthy")


async def test_the_readme_sdk_snippets_run_as_written_against_the_default_mesh(http, tmp_path):
    section = readme_section("Joining the mesh with the SDK")
    [credentials] = code_blocks(section, "bash")
    agent_code, caller_code = code_blocks(section, "python")
    async with doc_mesh(http, tmp_path) as mesh:
        env = {**doc_environment(mesh),
               **await exported(credentials, tmp_path, mesh, ("AGENTREACH_TOKEN", "AGENTREACH_API_KEY"))}
        with python_process(tmp_path, "agent", ["-c", mesh.on_our_ports(agent_code)], env) as agent:
            await healthy(http, mesh, tmp_path, "echo-agent-01", agent)
            caller = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", mesh.on_our_ports(caller_code)],
                                             capture_output=True, text=True, timeout=30, cwd=tmp_path, env=env)
    assert caller.returncode == 0, caller.stderr
    assert "'echo': {'text': 'hello'}" in caller.stdout


async def test_the_examples_run_as_their_docstrings_say_against_the_default_mesh(http, tmp_path):
    async with doc_mesh(http, tmp_path) as mesh:
        env = {**doc_environment(mesh), **await exported(
            "export AGENTREACH_TOKEN=$(agentreach tokens create --service echo | jq -r .token)\n"
            "export INTENT_TOKEN=$(agentreach tokens create --service intent | jq -r .token)\n"
            "export AGENTREACH_API_KEY=$(agentreach clients create --name examples --trust internal "
            "--grant demo.echo --grant intent.detect | jq -r .api_key)",
            tmp_path, mesh, ("AGENTREACH_TOKEN", "INTENT_TOKEN", "AGENTREACH_API_KEY"))}
        intent_env = {**env, "AGENTREACH_TOKEN": env["INTENT_TOKEN"],
                      "INTENT_BASE_URL": f"http://127.0.0.1:{free_port()}"}
        with (python_process(tmp_path, "echo", [str(EXAMPLES / "echo_agent.py"), "--port", "0"], env) as echo,
              python_process(tmp_path, "intent", [str(EXAMPLES / "intent_fastapi_after.py")], intent_env) as intent):
            await healthy(http, mesh, tmp_path, "echo-agent-01", echo)
            await healthy(http, mesh, tmp_path, "intent-agent-prod-01", intent)
            caller = await asyncio.to_thread(
                subprocess.run, [sys.executable, str(EXAMPLES / "caller.py"), "demo.echo", '{"text": "hello"}',
                                "--router", mesh.router_url],
                capture_output=True, text=True, timeout=30, cwd=tmp_path, env=env)
            assert caller.returncode == 0, caller.stdout + caller.stderr
            printed = json.loads(caller.stdout)
            assert printed["result"]["echo"] == {"text": "hello"} and printed["route"]["instance"] == "echo-agent-01"
            frame = {"capability": "intent.detect", "payload": {"text": "I want a refund", "session_id": "s-1"}}
            async with http.post(f"{mesh.router_url}/atp", json=frame,
                                 headers={"X-API-Key": env["AGENTREACH_API_KEY"]}) as response:
                answer = await response.json()
            assert response.status == 200, answer
            assert answer["result"] == {"intent": "refund.request", "confidence": 0.9}

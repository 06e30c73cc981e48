"""The examples a newcomer runs, run as they would run them: child processes on loopback."""

from __future__ import annotations

import asyncio
import difflib
import json
import signal

from conftest import wait_for
from sdk_support import EXAMPLES, agent_view, free_port, post_frame, read_log_until, spawn_example, wait_state


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
                                     f"http://127.0.0.1:{free_port()}", "--registry", registry.url)
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

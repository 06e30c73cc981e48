"""Acknowledged registrations survive restarts and SIGKILL; snapshots keep replay short."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import aiohttp

from conftest import post, registration
from storage_support import AGENTREACH, start_logged


async def test_registrations_survive_a_restart(start_registry, http, tmp_path):
    data_dir = tmp_path / "durable"
    first = await start_registry(data_dir)
    for i in range(20):
        await post(http, f"{first.url}/register", registration(f"a{i}", f"cap.{i}", service=f"s{i % 3}"))
    await post(http, f"{first.url}/deregister", {"agent_id": "a7"})
    await first.stop()
    second = await start_registry(data_dir)
    ids = {a.agent_id for a in second.registry.agents()}
    assert ids == {f"a{i}" for i in range(20)} - {"a7"}
    assert second.replay.records_replayed == 22  # 20 registrations; a7's binding, then its deletion
    # Soft state is not logged: after a restart everyone waits for a heartbeat again.
    assert {a.state for a in second.registry.agents()} == {"pending"}
    # Ownership is rebuilt from the log too.
    status, body = await post(http, f"{second.url}/register", registration("x", "cap.1", service="other"))
    assert status == 409 and body["owner"] == "s1"


def _start_registry_process(data_dir: Path) -> tuple[subprocess.Popen, str]:
    # Not a test of auth: agents register without tokens.
    running = start_logged([*AGENTREACH, "registry", "--port", "0", "--data-dir", str(data_dir), "--auth", "off"],
                           ready="registry listening", timeout=20)
    return running.process, running.url


async def test_sigkill_during_a_registration_storm_loses_nothing_acknowledged(tmp_path):
    data_dir = tmp_path / "crash"
    process, url = await asyncio.to_thread(_start_registry_process, data_dir)
    acknowledged: set[str] = set()
    enough = asyncio.Event()

    async def writer(session: aiohttp.ClientSession, worker: int) -> None:
        for n in range(10_000):
            agent_id = f"w{worker}-{n}"
            try:
                async with session.post(f"{url}/register", json=registration(agent_id, f"cap.{agent_id}")) as r:
                    if r.status == 200:
                        acknowledged.add(agent_id)
            except (TimeoutError, aiohttp.ClientError):
                return
            if len(acknowledged) >= 400:
                enough.set()

    try:
        async with aiohttp.ClientSession() as session:
            writers = [asyncio.create_task(writer(session, w)) for w in range(32)]
            await asyncio.wait_for(enough.wait(), timeout=60)
            os.kill(process.pid, signal.SIGKILL)  # mid-storm: 32 writers have requests in flight
            await asyncio.gather(*writers)
        await asyncio.to_thread(process.wait, 10)
        assert process.returncode == -signal.SIGKILL
        restarted, url = await asyncio.to_thread(_start_registry_process, data_dir)
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{url}/agents") as response:
                recovered = {agent["agent_id"] for agent in (await response.json())["agents"]}
        finally:
            restarted.terminate()
            await asyncio.to_thread(restarted.wait, 10)
        assert len(acknowledged) >= 400
        assert acknowledged <= recovered, f"lost {len(acknowledged - recovered)} acknowledged registrations"
    finally:
        if process.poll() is None:
            process.kill()


async def test_snapshots_and_compaction_keep_replay_short(start_registry, http, tmp_path):
    data_dir = tmp_path / "compact"
    first = await start_registry(data_dir, snapshot_every=100)
    for _ in range(6):
        results = await asyncio.gather(*(
            post(http, f"{first.url}/register", registration(f"a{i}", f"cap.{i}")) for i in range(100)))
        assert all(status == 200 for status, _ in results)
    await first.stop()
    segments_after = sorted(p.name for p in (data_dir / "wal").iterdir())
    second = await start_registry(data_dir, snapshot_every=100)
    assert second.replay.snapshot_index + second.replay.records_replayed == 600
    assert second.replay.records_replayed < 300
    assert {a.agent_id for a in second.registry.agents()} == {f"a{i}" for i in range(100)}
    assert sum(name.endswith(".snap") for name in segments_after) == 1

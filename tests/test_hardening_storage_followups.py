"""Storage follow-ups: a full disk during health sweeps, WAL health in /metrics, how much eviction
history is kept (--evicted-history, --evicted-history-hours), private files made one way.

The full disk is a real 8 MiB tmpfs mounted over a directory in a private mount namespace around
a real `agentreach registry` process (as in test_hardening_storage); the test fills it through
/proc/PID/root and empties it again.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_reach.exhaustion import REPORT_INTERVAL
from prometheus_client.parser import text_string_to_metric_families

from agentreach.demo import demo_credentials
from conftest import FakeAgent, post, registration, wait_for
from router.keyring import KeyRing
from storage_support import AGENTREACH, NAMESPACE, Running, fill, start_logged

ON_SMALL_DISK = 'mount -t tmpfs -o size=8m tmpfs "$1" && shift && exec "$@"'
REFUSED_EVICTION = "evictions wait"


class SmallDisk:
    """A registry whose data dir is on a tmpfs only it sees, and the file that fills that tmpfs."""

    def __init__(self, running: Running, filler: Path):
        self.running = running
        self.filler = filler

    @property
    def url(self) -> str:
        return self.running.url

    async def refuse_writes(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        """Fill the disk, then register `body` again and again until the WAL says it cannot write
        (one instance, so the eviction guard never counts fillers)."""
        await asyncio.to_thread(fill, self.filler)
        for _ in range(200):  # the segment's last page may still hold a few records
            status, _ = await post(http, f"{self.url}/register", body)
            if status == 503:
                return
            assert status == 200
        raise AssertionError("the registry kept acknowledging changes on a full disk")

    async def take_writes_again(self, http: aiohttp.ClientSession) -> None:
        self.filler.unlink()

        async def healthy() -> bool:
            async with http.get(f"{self.url}/healthz") as response:
                return response.status == 200
        await wait_for(healthy, timeout=20, what="the registry to take writes again")


async def stop(started: list[Running]) -> None:
    for running in started:
        running.process.terminate()
        assert await asyncio.to_thread(running.process.wait, 20) == 0


@pytest.fixture
async def small_disk(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[SmallDisk]]]:
    started: list[Running] = []

    async def start(*knobs: str) -> SmallDisk:
        small = tmp_path / "small"
        small.mkdir()
        command = [*NAMESPACE, ON_SMALL_DISK, "sh", str(small), *AGENTREACH, "registry", "--port", "0",
                   "--data-dir", f"{small}/data", "--auth", "off", *knobs]
        running = await asyncio.to_thread(start_logged, command, ready="registry listening")
        started.append(running)
        return SmallDisk(running, Path(f"/proc/{running.process.pid}/root{small}/filler"))

    yield start
    await stop(started)  # the registry itself: the namespace's shell exec'd it


async def metric_samples(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


async def test_an_eviction_the_full_disk_refuses_is_one_line_per_interval_and_happens_once_it_takes_writes(
        small_disk, http, agent: FakeAgent):
    disk = await small_disk("--silence-timeout", "0.2", "--health-interval", "0.05", "--evict-after", "1")
    watched = registration("watched", "cap.watched", base_url=agent.url)
    assert (await post(http, f"{disk.url}/register", watched))[0] == 200
    await wait_for(lambda: agent.health_checks > 0, what="the sweep to probe the silent instance")
    await disk.refuse_writes(http, watched)
    agent.healthy = False

    def health_log() -> list[dict]:
        return disk.running.events("agentreach.registry.health")

    def refusals() -> list[dict]:
        return [event for event in health_log() if event["event"].startswith(REFUSED_EVICTION)]

    await wait_for(refusals, what="the refused eviction to be logged")
    first_seen = time.monotonic()
    checks = agent.health_checks
    await wait_for(lambda: agent.health_checks >= checks + 5, what="the sweep to go on while the disk is full")
    elapsed = time.monotonic() - first_seen

    # One line per interval since the first (plus one for the time the first took to be seen here),
    # where every sweep used to log its own traceback.
    assert len(refusals()) <= 2 + elapsed // REPORT_INTERVAL
    [first, *_] = refusals()
    assert first["level"] == "error" and first["events"] == 1
    assert "No space left on device" in first["problem"] and first["deferred"] == 1
    assert [event for event in health_log() if "exception" in event or "sweep failed" in event["event"]] == []

    await disk.take_writes_again(http)

    async def evicted() -> bool:
        async with http.get(f"{disk.url}/agents/watched") as response:
            return (await response.json())["state"] == "evicted"
    await wait_for(evicted, what="the eviction once the disk takes writes")


async def test_metrics_say_whether_storage_takes_writes_and_count_its_outages(small_disk, http):
    disk = await small_disk()
    samples = await metric_samples(http, disk.url)
    assert samples["agentreach_registry_storage_available"] == 1
    assert samples["agentreach_registry_storage_outages_total"] == 0

    await disk.refuse_writes(http, registration("filler", "cap.filler"))
    samples = await metric_samples(http, disk.url)
    assert samples["agentreach_registry_storage_available"] == 0
    assert samples["agentreach_registry_storage_outages_total"] == 1

    await disk.take_writes_again(http)
    samples = await metric_samples(http, disk.url)
    assert samples["agentreach_registry_storage_available"] == 1
    assert samples["agentreach_registry_storage_outages_total"] == 1


@pytest.fixture
async def evicting_registry(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """`agentreach registry` with `knobs` that evicts a silent instance after one failed check."""
    started: list[Running] = []

    async def start(*knobs: str) -> str:
        command = [*AGENTREACH, "registry", "--port", "0", "--data-dir", str(tmp_path / "data"), "--auth", "off",
                   "--silence-timeout", "0.1", "--health-interval", "0.05", "--evict-after", "1", *knobs]
        started.append(await asyncio.to_thread(start_logged, command, ready="registry listening"))
        return started[-1].url

    yield start
    await stop(started)


async def history_after_three_evictions(http: aiohttp.ClientSession, url: str, expected: list[str]) -> None:
    """Three instances nobody answers for (port 9), all evicted: /agents settles on ``expected``.

    Older history is released just after the eviction that pushed it out is counted, so the check
    waits for the final state (three evictions and the history expected) rather than reading once."""
    for n in range(3):
        assert (await post(http, f"{url}/register", registration(f"gone{n}", f"cap.gone{n}")))[0] == 200
    seen: dict[str, object] = {}

    async def settled() -> bool:
        seen["evictions"] = (await metric_samples(http, url))["agentreach_registry_evictions_total"]
        async with http.get(f"{url}/agents") as response:
            seen["history"] = [agent["state"] for agent in (await response.json())["agents"]]
        return seen == {"evictions": 3, "history": expected}
    await wait_for(settled, what=f"three evictions leaving {expected}")


async def test_evicted_history_keeps_the_newest_n(evicting_registry, http):
    url = await evicting_registry("--evicted-history", "1")
    await history_after_three_evictions(http, url, ["evicted"])


async def test_evicted_history_hours_zero_keeps_none(evicting_registry, http):
    url = await evicting_registry("--evicted-history-hours", "0")
    await history_after_three_evictions(http, url, [])


@pytest.mark.parametrize("command", ["registry", "up"])
@pytest.mark.parametrize(("flag", "value"), [("--evicted-history", "-1"), ("--evicted-history-hours", "-1"),
                                         ("--evicted-history-hours", "nan")])
def test_a_history_bound_below_zero_or_not_a_number_is_refused(tmp_path, command, flag, value):
    done = subprocess.run([*AGENTREACH, command, "--data-dir", str(tmp_path / "data"), flag, value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"{flag} must be a number of at least 0" in done.stderr
    assert not (tmp_path / "data").exists()


def modes(root: Path) -> dict[str, str]:
    """Every path under `root` (itself as "."), with its permission bits."""
    return {str(path.relative_to(root)): f"{stat.S_IMODE(path.lstat().st_mode):04o}"
            for path in [root, *root.rglob("*")]}


@pytest.fixture
def loosest_umask() -> Iterator[None]:
    """umask 0: every mode given to mkdir/open is kept as given, so only an explicit one keeps a path private."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_router_signing_keys_and_the_dirs_made_for_them_are_private(tmp_path, loosest_umask):
    KeyRing(tmp_path / "data" / "keys", ttl=60, leeway=0).load()
    [pem] = (tmp_path / "data" / "keys").glob("*.pem")
    assert modes(tmp_path / "data") == {".": "0700", "keys": "0700", f"keys/{pem.name}": "0600"}


async def test_demo_secrets_are_private_even_where_a_loose_stale_file_was(start_registry, tmp_path, loosest_umask):
    server = await start_registry(tmp_path / "data", auth=True)
    folder = tmp_path / "data" / "demo"
    folder.mkdir(mode=0o700)
    stale = folder / "demo-caller.key"
    stale.write_text("a key nobody holds\n")
    stale.chmod(0o644)
    await demo_credentials(server.registry, tmp_path / "data")
    assert stale.read_text().strip() != "a key nobody holds"
    secrets = ["demo-echo.token", "demo-intent.token", "demo-orders.token", "demo-orders.key", "demo-caller.key"]
    assert modes(folder) == {".": "0700", **dict.fromkeys(secrets, "0600")}

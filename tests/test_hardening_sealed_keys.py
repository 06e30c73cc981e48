"""No usable call-signing key at rest (hardening item 1, the secrets part).

A token's signing key lets whoever holds it sign calls to that service. The log and its snapshots
keep it sealed under ``<data-dir>/secrets.key``; routers get it in the clear over the admin-only
watch feed and keep it in memory. Real registries on real data dirs, a real router following over
HTTP, a real SDK agent; every byte of every file under the data dir is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from agent_reach import ReachClient
from agent_reach.serving import cancel
from agent_reach.signing import signing_key

from auth.kek import SECRETS_KEY_FILE, SecretsKeyError
from auth.records import TokenRecord
from auth.sealing import SealError, seal, unseal
from auth.secrets import digest
from conftest import wait_for
from registry.lifecycle import LifecycleConfig
from registry.reseal import PENDING_FILE
from registry.server import RegistryServer, RegistrySettings
from registry.store import WalStore
from router.feed import follow_http
from router.mirror import RegistryMirror
from router.server import RouterServer, RouterServerSettings
from sdk_support import free_port, issue_token
from storage_support import agentreach

Serve = Callable[..., Awaitable[RegistryServer]]


def test_a_sealed_key_opens_with_its_key_for_its_record_only() -> None:
    kek, key = os.urandom(32), signing_key("art_example")
    sealed = seal(kek, "tok_a", key)
    assert unseal(kek, "tok_a", sealed) == key
    assert key not in sealed and seal(kek, "tok_a", key) != sealed, "a fresh nonce each time"
    flipped = sealed[:20] + ("A" if sealed[20] != "A" else "B") + sealed[21:]
    for kek_used, record_id, value in ((kek, "tok_b", sealed), (os.urandom(32), "tok_a", sealed),
                                       (kek, "tok_a", flipped), (kek, "tok_a", "short"), (kek, "tok_a", "!!")):
        with pytest.raises(SealError):
            unseal(kek_used, record_id, value)


def every_byte(data_dir: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(data_dir.rglob("*")) if path.is_file())


def assert_nothing_usable(data_dir: Path, *secrets: str) -> None:
    on_disk = every_byte(data_dir)
    assert on_disk, "the scan read something"
    for secret in secrets:
        assert secret.encode() not in on_disk, f"{secret[:8]}… is on disk"
        if len(secret) == 64:
            assert bytes.fromhex(secret) not in on_disk, f"{secret[:8]}… is on disk as raw bytes"


@pytest.fixture
def serve(teardown: contextlib.AsyncExitStack) -> Serve:
    """Start a registry (auth on) on a chosen data dir and port, snapshotting often so snapshots are read too."""

    async def start(data_dir: Path, port: int = 0, snapshot_every: int = 3) -> RegistryServer:
        server = RegistryServer(RegistrySettings(data_dir=data_dir, port=port, auth=True, snapshot_every=snapshot_every,
                                                 lifecycle=LifecycleConfig(silence_timeout=30, health_interval=30)))
        await server.start()
        teardown.push_async_callback(server.stop)
        return server

    return start


async def follower(http: aiohttp.ClientSession, registry: RegistryServer, admin: str,
                   teardown: contextlib.AsyncExitStack) -> RegistryMirror:
    """A router's view of ``registry``, fed over HTTP as a router elsewhere would be."""
    mirror = RegistryMirror()
    task = asyncio.create_task(follow_http(http, registry.url, mirror, admin_key=admin))
    teardown.push_async_callback(cancel, task)
    await wait_for(lambda: mirror.synced, what="the follower to load the registry")
    return mirror


async def test_no_signing_key_at_rest_and_calls_stay_signed_across_a_restart(
        serve: Serve, make_agent: Any, teardown: contextlib.AsyncExitStack, tmp_path: Path,
        http: aiohttp.ClientSession) -> None:
    data, port = tmp_path / "data", free_port()
    registry = await serve(data, port)
    admin = registry.new_admin_key
    assert admin is not None
    kek_file = data / SECRETS_KEY_FILE
    assert stat.S_IMODE(kek_file.stat().st_mode) == 0o600
    issued = [await issue_token(http, registry.url, admin, service) for service in ("echo", "other", "third")]
    token = issued[0]["token"]
    key = signing_key(token)

    router = RouterServer(RouterServerSettings(port=0, auth=False, registry_url=registry.url, registry_key=admin))
    await router.start()
    teardown.push_async_callback(router.stop)
    agent = make_agent("echo-1", registry.url, service="echo", registration_token=token)

    @agent.capability("echo.say")
    async def say(payload: Any, ctx: Any) -> Any:
        return {"said": payload}

    await agent.start()
    await wait_for(lambda: router.mirror.auth.signing_key(issued[0]["token_id"]) == key,
                   what="the router to hold the key in memory")
    await wait_for(lambda: "echo-1" in router.mirror.instances, what="the router to know echo-1")
    async with ReachClient(router.url) as client:
        assert await client.call("echo.say", 1) == {"said": 1}, "the agent accepts the router's signature"
    async with http.post(f"{registry.url}/tokens/{issued[1]['token_id']}/revoke",
                         headers={"X-API-Key": admin}) as response:
        assert response.status == 200
    await wait_for(lambda: registry.store.wal.stats.snapshot_index > 0,
                   what="a snapshot to be written (snapshots are scanned too)")
    assert_nothing_usable(data, *[t["token"] for t in issued], *[signing_key(t["token"]) for t in issued])

    await registry.stop()
    assert_nothing_usable(data, *[t["token"] for t in issued], *[signing_key(t["token"]) for t in issued])
    again = await serve(data, port)
    mirror = await follower(http, again, admin, teardown)
    assert mirror.auth.signing_key(issued[0]["token_id"]) == key, "a restarted registry still feeds the key"
    assert mirror.auth.signing_key(issued[1]["token_id"]) is None, "a revoked token's key is not used"
    await wait_for(lambda: router.mirror.revision == again.store.revision, what="the router to follow the restart")
    async with ReachClient(router.url) as client:
        assert await client.call("echo.say", 2) == {"said": 2}


async def test_a_log_written_before_sealing_is_resealed_and_its_clear_bytes_leave_the_data_dir(
        serve: Serve, tmp_path: Path, http: aiohttp.ClientSession, teardown: contextlib.AsyncExitStack) -> None:
    data = tmp_path / "old"
    token = "art_" + "o" * 43
    key = signing_key(token)
    # What the previous version wrote: the key in the clear, in a snapshot and in segments after it.
    old = {"token_id": "tok_old", "service": "legacy", "token_digest": digest(token), "signing_key": key,
           "created_at": 1.0}
    store = WalStore(data, snapshot_every=10_000)
    store.open()
    await store.put("tokens/tok_old", msgspec.msgpack.encode(old))
    await store.wal.snapshot(store.revision, msgspec.msgpack.encode(store.snapshot()))
    await store.put("tokens/tok_old", msgspec.msgpack.encode({**old, "created_at": 2.0}))
    await store.close()
    assert key.encode() in every_byte(data), "the control: the old format is on disk in the clear"

    registry = await serve(data, snapshot_every=10_000)
    assert_nothing_usable(data, token, key)
    [stored] = [msgspec.msgpack.decode(value, type=TokenRecord) for name, value in registry.store.snapshot().items()
                if name == "tokens/tok_old"]
    assert stored.signing_key is None and stored.sealed_key is not None and stored.created_at == 2.0
    assert registry.registry.state.auth.token(token).service == "legacy"  # type: ignore[union-attr]
    admin = registry.new_admin_key
    assert admin is not None
    mirror = await follower(http, registry, admin, teardown)
    assert mirror.auth.signing_key("tok_old") == key

    await registry.stop()
    again = await serve(data, snapshot_every=10_000)
    assert_nothing_usable(data, token, key)
    assert again.registry.state.auth.token(token).service == "legacy"  # type: ignore[union-attr]


async def test_start_is_refused_with_a_readable_or_another_secrets_key(serve: Serve, tmp_path: Path,
                                                                      http: aiohttp.ClientSession) -> None:
    data = tmp_path / "data"
    registry = await serve(data)
    assert registry.new_admin_key is not None
    await issue_token(http, registry.url, registry.new_admin_key, "svc")
    await registry.stop()
    kek_file = data / SECRETS_KEY_FILE
    original = kek_file.read_bytes()

    async def refusal() -> str:
        server = RegistryServer(RegistrySettings(data_dir=data, port=0, auth=True))
        with pytest.raises(SecretsKeyError) as refused:
            await server.start()
        await server.stop()
        return str(refused.value)

    kek_file.chmod(0o640)
    assert "readable by its owner only" in await refusal()
    kek_file.chmod(0o600)
    kek_file.write_bytes(os.urandom(32).hex().encode() + b"\n")
    assert "restore the secrets.key" in await refusal()
    kek_file.write_text("not a key\n")
    assert "64 hex digits" in await refusal()
    kek_file.write_bytes(original)
    await serve(data)


async def test_a_reseal_cut_short_by_a_crash_is_finished_at_the_next_start(serve: Serve, tmp_path: Path) -> None:
    data = tmp_path / "cut"
    token = "art_" + "c" * 43
    key = signing_key(token)
    kek = os.urandom(32)
    data.mkdir()
    (data / SECRETS_KEY_FILE).write_text(kek.hex() + "\n")
    (data / SECRETS_KEY_FILE).chmod(0o600)
    old = {"token_id": "tok_cut", "service": "cut", "token_digest": digest(token), "created_at": 1.0}
    store = WalStore(data)
    store.open()
    await store.put("tokens/tok_cut", msgspec.msgpack.encode({**old, "signing_key": key}))
    # The crash: the record was resealed, the snapshot that drops the clear copy never written.
    (data / PENDING_FILE).touch()
    await store.put("tokens/tok_cut", msgspec.msgpack.encode({**old, "sealed_key": seal(kek, "tok_cut", key)}))
    await store.close()
    assert key.encode() in every_byte(data), "the control: the clear copy is still in a segment"

    registry = await serve(data, snapshot_every=10_000)
    assert_nothing_usable(data, token, key)
    assert not (data / PENDING_FILE).exists()
    assert registry.registry.state.auth.token(token).service == "cut"  # type: ignore[union-attr]


def test_the_command_refuses_a_readable_secrets_key_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / SECRETS_KEY_FILE).write_text(os.urandom(32).hex() + "\n")
    (data / SECRETS_KEY_FILE).chmod(0o644)
    done = agentreach("registry", "--port", "0", "--data-dir", str(data))
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("agentreach: refusing to start")]
    assert "readable by its owner only (chmod 600)" in line and "Traceback" not in done.stderr

"""The WAL's writer: group commit, one sync per record without it, on_commit order and failure, misuse."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from wal import WalError, WriteAheadLog
from wal_support import Replayed, open_log, replay


async def test_group_commit_batches_concurrent_appends(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir)

    async def writer(number: int) -> list[tuple[int, bytes]]:
        done = []
        for k in range(5):
            payload = f"writer-{number}-{k}".encode()
            done.append((await log.append(payload), payload))
        return done

    results = [pair for batch in await asyncio.gather(*(writer(n) for n in range(64))) for pair in batch]
    assert sorted(index for index, _ in results) == list(range(1, 321))
    stats = log.stats
    assert stats.records == 320
    assert stats.syncs == stats.batches < 320 / 8
    await log.close()

    _, replayed = await replay(wal_dir)
    assert sorted(replayed.records) == sorted(results)


async def test_without_group_commit_every_record_gets_its_own_sync(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir, group_commit=False)
    indexes = await asyncio.gather(*(log.append(f"r{n}".encode()) for n in range(64)))
    assert sorted(indexes) == list(range(1, 65))
    assert log.stats.syncs == log.stats.batches == log.stats.records == 64
    await log.close()
    _, replayed = await replay(wal_dir)
    assert replayed.indexes == list(range(1, 65))


async def test_on_commit_sees_index_order_on_the_loop_thread_before_append_returns(wal_dir: Path) -> None:
    committed: dict[int, bytes] = {}
    order: list[int] = []
    loop_thread = threading.get_ident()

    def on_commit(index: int, payload: bytes) -> None:
        assert threading.get_ident() == loop_thread
        committed[index] = payload
        order.append(index)

    log, _, _ = open_log(wal_dir, on_commit=on_commit)

    async def writer(number: int) -> None:
        for k in range(10):
            payload = f"{number}:{k}".encode()
            index = await log.append(payload)
            assert committed[index] == payload

    await asyncio.gather(*(writer(n) for n in range(16)))
    assert order == list(range(1, 161))
    await log.close()


async def test_on_commit_failure_stops_the_log(wal_dir: Path) -> None:
    def on_commit(index: int, payload: bytes) -> None:
        if payload == b"poison":
            raise RuntimeError("registry could not apply")

    log, _, _ = open_log(wal_dir, on_commit=on_commit)
    assert await log.append(b"fine") == 1
    with pytest.raises(WalError, match="on_commit raised") as raised:
        await log.append(b"poison")
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(WalError, match="stopped"):
        await log.append(b"after")
    await log.close()
    _, replayed = await replay(wal_dir)
    assert replayed.records == [(1, b"fine"), (2, b"poison")]


async def test_misuse_is_refused(wal_dir: Path) -> None:
    log, _, _ = open_log(wal_dir)
    with pytest.raises(WalError, match="already open"):
        open_log(wal_dir)
    with pytest.raises(WalError, match="only once"):
        log.open(Replayed().apply_snapshot, Replayed().apply_record)
    with pytest.raises(TypeError):
        await log.append("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside"):
        await log.snapshot(1, b"state")
    await log.close()
    with pytest.raises(WalError, match="closed"):
        await log.append(b"late")
    with pytest.raises(WalError, match="not been called"):
        await WriteAheadLog(wal_dir).append(b"early")
    await replay(wal_dir)

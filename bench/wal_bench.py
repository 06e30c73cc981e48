"""Benchmark the write-ahead log: durable appends/s and replay time.

    python bench/wal_bench.py [--records N] [--replay-records N] [--json out.json] [--drop-caches]

Compares group commit with one fdatasync per record, with 1 and 64 concurrent
writers, in the same run; then builds a 1,000,000-record log once (group
commit, big batches) and times open() with a trivial apply. Logs go in a
temporary directory on a real disk (never tmpfs), removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from common import RESULTS, machine
from wal import WriteAheadLog

RAM_FILESYSTEMS = {"tmpfs", "ramfs"}
BUILD_WAVE = 10_000


def mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, filesystem type, device) of the mount holding `path`, from /proc/mounts."""
    best = ("/", "unknown", "unknown")
    resolved = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, point, fstype = line.split()[:3]
            inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, fstype, device)
    return best


def scratch_base() -> Path:
    """The system temp dir if it is on a real disk, else bench/results/ (gitignored)."""
    temp = Path(tempfile.gettempdir())
    if mount_of(temp)[1] not in RAM_FILESYSTEMS:
        return temp
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS


def payloads(count: int, seed: int) -> list[bytes]:
    """~200-byte JSON-ish payloads (150-250 bytes), like registry change records."""
    rng = random.Random(seed)
    pool = [os.urandom(128).hex().encode() for _ in range(64)]
    return [b'{"op":"put","key":"agent-%d","value":"%s"}' % (n, pool[n % 64][: rng.randint(110, 210)])
            for n in range(count)]


async def measure_appends(directory: Path, records: int, writers: int, group_commit: bool) -> dict:
    log = WriteAheadLog(directory, group_commit=group_commit)
    log.open(lambda index, data: None, lambda index, payload: None)
    data = payloads(records, seed=writers)

    async def writer(number: int) -> None:
        for payload in data[number::writers]:
            await log.append(payload)

    started = time.perf_counter()
    await asyncio.gather(*(writer(n) for n in range(writers)))
    seconds = time.perf_counter() - started
    stats = log.stats
    await log.close()
    return {
        "writers": writers,
        "group_commit": group_commit,
        "records": stats.records,
        "seconds": seconds,
        "appends_per_second": stats.records / seconds,
        "batches": stats.batches,
        "syncs": stats.syncs,
        "records_per_batch": stats.records / stats.batches,
    }


async def build_log(directory: Path, records: int) -> float:
    """Write `records` records through append(), BUILD_WAVE concurrent appends at a time."""
    log = WriteAheadLog(directory)
    log.open(lambda index, data: None, lambda index, payload: None)
    data = payloads(BUILD_WAVE, seed=0)
    started = time.perf_counter()
    for start in range(0, records, BUILD_WAVE):
        await asyncio.gather(*(log.append(payload) for payload in data[: min(BUILD_WAVE, records - start)]))
    seconds = time.perf_counter() - started
    await log.close()
    return seconds


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("1\n")


def measure_replay(directory: Path, drop_caches: bool) -> dict:
    if drop_caches:
        drop_page_cache()
    count = 0
    payload_bytes = 0

    def apply_record(index: int, payload: bytes) -> None:
        nonlocal count, payload_bytes
        count += 1
        payload_bytes += len(payload)

    log = WriteAheadLog(directory)
    started = time.perf_counter()
    report = log.open(lambda index, data: None, apply_record)
    seconds = time.perf_counter() - started
    asyncio.run(log.close())
    disk_bytes = sum(path.stat().st_size for path in directory.glob("*.seg"))
    return {
        "records": count,
        "segments": report.segments,
        "payload_bytes": payload_bytes,
        "disk_bytes": disk_bytes,
        "seconds": seconds,
        "records_per_second": count / seconds,
        "page_cache": "cold" if drop_caches else "warm",
    }


def disk(scratch: Path) -> dict[str, str]:
    """Where the logs were written: appends/s are the disk's fsync rate more than anything else."""
    point, fstype, device = mount_of(scratch)
    return {"filesystem": fstype, "device": device, "mount": point, "directory": str(scratch)}


def render(result: dict) -> str:
    info = result["machine"]
    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}",
        f"Logs in: {info['directory']} ({info['filesystem']} on {info['device']}, mounted at {info['mount']})",
        "",
        f"Durable appends ({result['records']:,} records per run, 150-250 byte payloads)",
        f"{'writers':>7}  {'group commit':>22}  {'one sync per record':>22}  {'ratio':>6}",
    ]
    for writers in (1, 64):
        group, single = (result["appends"][f"{mode}_{writers}"] for mode in ("group", "single"))
        lines.append(
            f"{writers:>7}  {_rate(group):>22}  {_rate(single):>22}  "
            f"{group['appends_per_second'] / single['appends_per_second']:>5.1f}x"
        )
    lines.append(f"Group commit vs one sync per record at 64 writers: {result['ratio_at_64']:.1f}x (target >= 5x)")
    replay, build = result["replay"], result["build"]
    lines += [
        "",
        f"Replay: {replay['records']:,} records, {replay['segments']} segments, "
        f"{replay['disk_bytes'] / 2**20:,.0f} MiB on disk, {replay['page_cache']} page cache",
        f"  open() took {replay['seconds']:.2f} s ({replay['records_per_second']:,.0f} records/s)",
        f"  (building it through append() took {build['seconds']:.1f} s, {build['records_per_second']:,.0f} records/s)",
    ]
    return "\n".join(lines)


def _rate(run: dict) -> str:
    return f"{run['appends_per_second']:,.0f}/s ({run['syncs']:,} syncs)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000, help="appends per throughput run (default 10000)")
    parser.add_argument("--replay-records", type=int, default=1_000_000, help="records in the replay log")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before replay (root)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=scratch_base()))
    try:
        appends = {}
        for writers in (1, 64):
            for mode, group_commit in (("group", True), ("single", False)):
                directory = scratch / f"{mode}-{writers}"
                appends[f"{mode}_{writers}"] = asyncio.run(
                    measure_appends(directory, args.records, writers, group_commit))
        replay_dir = scratch / "replay"
        build_seconds = asyncio.run(build_log(replay_dir, args.replay_records))
        result = {
            "machine": machine(**disk(scratch)),
            "records": args.records,
            "appends": appends,
            "ratio_at_64": appends["group_64"]["appends_per_second"] / appends["single_64"]["appends_per_second"],
            "build": {"seconds": build_seconds, "records_per_second": args.replay_records / build_seconds},
            "replay": measure_replay(replay_dir, args.drop_caches),
        }
    finally:
        shutil.rmtree(scratch)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

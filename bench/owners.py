"""Where a serving process's CPU goes, by owner of the code: py-spy samples it under load and each sample's
innermost frame is charged to the owner of its file (the mesh's own code, aiohttp's client or server, asyncio,
the rest). `bench/datapath_bench.py --profile SECONDS` prints it a call for the proxy, the floor and the router.

py-spy (the `bench` extra) samples from outside the process without pausing it (``--nonblocking``), so the
profiled code runs as it does unprofiled, at the cost of a few torn stacks; idle threads are not sampled.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from common import ROOT

RATE_HZ = 200
# Installed with the bench extra, beside this interpreter (a venv's bin need not be on PATH); None: missing.
PY_SPY = shutil.which("py-spy", path=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
# First match wins: a file's owner by its path (after site-packages/ for installed code).
OWNERS = (
    ("aiohttp client", re.compile(r"aiohttp/(client|connector)[^/]*\.py$")),
    ("aiohttp server", re.compile(r"aiohttp/(web|http_parser)[^/]*\.py$")),
    ("aiohttp, both (streams, writer, helpers)", re.compile(r"aiohttp/")),
    ("yarl, multidict", re.compile(r"(yarl|multidict)/")),
    ("asyncio and selectors", re.compile(r"/(asyncio/[^/]+|selectors|_weakrefset|contextvars)\.py$")),
    ("sqlite (audit writer)", re.compile(r"(aiosqlite/|sqlite3/)")),
    ("the mesh's own code", re.compile(r"^(router|mesh|auth|registry|weblayer|semantic|wal|agentreach|"
                                       r"sdk/agent_reach|agent_reach|bench)/")),
)
FRAME = re.compile(r"\(([^():]+):\d+\)$")


def owner_of(path: str) -> str:
    """The owner of a sampled frame's file; paths inside the repository are taken relative to it."""
    relative = path.split("site-packages/", 1)[-1]
    if relative == path and path.startswith(str(ROOT)):
        relative = path[len(str(ROOT)) + 1:]
    for owner, pattern in OWNERS:
        if pattern.search(relative):
            return owner
    return "other (C calls, stdlib)"


def owners_of_raw(raw: str) -> Counter[str]:
    """Samples by owner from py-spy's raw (collapsed stacks) output: ``frame;frame;... count`` a line."""
    samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        innermost = stack.rsplit(";", 1)[-1]
        found = FRAME.search(innermost)
        samples[owner_of(found.group(1)) if found else "other (C calls, stdlib)"] += int(count)
    return samples


def record(pid: int, seconds: int) -> Counter[str]:
    """Samples by owner of ``pid`` and its subprocesses over ``seconds`` (py-spy must be installed)."""
    assert PY_SPY is not None, "py-spy is not installed"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "stacks.txt"
        subprocess.run([PY_SPY, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--full-filenames",
                        "--rate", str(RATE_HZ), "--duration", str(seconds), "--format", "raw", "--output", str(out)],
                       check=True, capture_output=True)
        return owners_of_raw(out.read_text())


def per_call_us(samples: Counter[str], calls: int) -> dict[str, float]:
    """Sampled CPU a call by owner, in µs (each sample stands for 1/RATE_HZ s of one running thread)."""
    return {owner: count / RATE_HZ / calls * 1e6 for owner, count in samples.most_common()}

"""Run `agentreach` as a real child process (optionally inside a private mount namespace) and read its log."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AGENTREACH = (sys.executable, "-m", "agentreach.cli")
# A shell in a private mount namespace (as root): what it mounts, only the processes it starts see.
NAMESPACE = ("unshare", "--mount", "--propagation", "private", "sh", "-c")


class Running:
    """A started `agentreach` process: the log event that said it was ready, and every stderr line so far."""

    def __init__(self, process: subprocess.Popen, ready: dict[str, Any], lines: list[str]):
        self.process = process
        self.ready = ready
        self.lines = lines

    @property
    def url(self) -> str:
        return self.ready["url"]

    def events(self, logger: str) -> list[dict[str, Any]]:
        return [event for event in map(json.loads, (line for line in self.lines if line.startswith("{")))
                if event["logger"] == logger]


def agentreach(*args: str) -> subprocess.CompletedProcess:
    """Run `agentreach` to completion from the repository root; its output captured as text."""
    return subprocess.run([*AGENTREACH, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def start_logged(command: Sequence[str], *, ready: str, umask: int | None = None, timeout: float = 30.0) -> Running:
    """Start `command` (agentreach, or something that runs it) and return once it logs the event `ready`;
    its stderr keeps being read."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("{") and json.loads(line)["event"] == ready:
            # Keep reading its log so a full pipe never blocks it.
            threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
            return Running(process, json.loads(line), lines)
    process.kill()
    raise AssertionError(f"{' '.join(command)} did not log {ready!r}:\n{''.join(lines)}")


def fill(path: Path) -> None:
    """Write to `path` until the file system has no space left."""
    chunk = bytes(64 * 1024)
    with open(path, "wb", buffering=0) as file:
        while True:
            try:
                file.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


def registry_child(shell: int) -> int:
    """The registry process the namespace's shell started."""
    [child] = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
    return int(child)

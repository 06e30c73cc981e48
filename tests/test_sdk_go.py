"""The Go SDK's own checks under pytest, so the one test command (``.venv/bin/pytest``, and CI) covers sdk-go:
gofmt, go vet, go test with its end-to-end tests required against this venv's mesh, and each fuzz target for a
bounded time. A missing or old Go toolchain fails rather than skips: CI must not pass without the Go SDK tested."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SDK_GO = Path(__file__).resolve().parent.parent / "sdk-go"
MIN_GO = (1, 22)
# Each target runs a fixed number of inputs, not a fixed time: go test fails a timed run ("context deadline
# exceeded") when its time runs out while a worker is still minimizing a new input, which a loaded machine
# makes likely. Minimizing is bounded too, so a run stays short.
FUZZ_TIME = "60000x"
FUZZ_MINIMIZE_TIME = "2s"
# A loaded 2-core machine builds, vets and runs slowly: go test starts a real mesh and builds agents.
QUICK_S, BUILD_S, TEST_S = 120, 600, 900
# Characters of a command's stdout and stderr shown when it fails (the end, where go prints the failure).
TAIL_CHARS = 6000


def _tails(stdout: str, stderr: str) -> str:
    return f"--- stdout (tail) ---\n{stdout[-TAIL_CHARS:]}\n--- stderr (tail) ---\n{stderr[-TAIL_CHARS:]}"


def run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``command`` in sdk-go/ and return its stdout; fail the test with the output's tails on a nonzero exit
    or past ``timeout`` (then the whole process group it started is killed: go test's binaries and their mesh).
    Output is read as bytes: a failing test may print what is not UTF-8 (a fuzzer's input, say)."""
    with subprocess.Popen(command, cwd=SDK_GO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          start_new_session=True) as process:
        try:
            raw = process.communicate(timeout=timeout)
            late = ""
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raw = process.communicate()
            late = f"did not finish within {timeout} s"
    stdout, stderr = (output.decode(errors="replace") for output in raw)
    if late or process.returncode != 0:
        pytest.fail(f"{shlex.join(command)} {late or f'exited {process.returncode}'}\n{_tails(stdout, stderr)}")
    return stdout


@functools.cache
def go_command() -> str:
    """The go command, at least MIN_GO; each test that needs it fails (not errors, not skips) without it."""
    path = shutil.which("go")
    if path is None:
        pytest.fail("go is not on PATH: run scripts/install-test-tools (the Go SDK's tests need go >= 1.22)")
    version = run([path, "env", "GOVERSION"], QUICK_S).strip()
    found = re.match(r"go(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) < MIN_GO:
        pytest.fail(f"{path} is {version!r}, the Go SDK needs go >= 1.22: run scripts/install-test-tools")
    return path


def test_gofmt() -> None:
    go = go_command()
    gofmt = Path(run([go, "env", "GOROOT"], QUICK_S).strip()) / "bin" / "gofmt"
    unformatted = run([str(gofmt), "-l", "."], QUICK_S)
    assert unformatted == "", f"gofmt would reformat these files in sdk-go:\n{unformatted}"


def test_go_vet() -> None:
    run([go_command(), "vet", "./..."], BUILD_S)


def test_go_test() -> None:
    """The unit tests and the end-to-end ones (mesh_support_test.go): the mesh from the venv running pytest, and
    AGENTREACH_E2E=required so a missing venv fails instead of skipping. Go's own timeout fires first, with the
    goroutines that hung."""
    env = {**os.environ, "AGENTREACH_E2E": "required", "AGENTREACH_VENV": str(Path(sys.executable).parent.parent)}
    run([go_command(), "test", "-timeout=600s", "./..."], TEST_S, env)


def fuzz_targets(listing: str) -> list[tuple[str, str]]:
    """(package, target) pairs from ``go test -list '^Fuzz' ./...``: each package's names, then its ``ok`` line."""
    targets: list[tuple[str, str]] = []
    names: list[str] = []
    for line in listing.splitlines():
        fields = line.split()
        if re.fullmatch(r"Fuzz\w*", line):
            names.append(line)
        elif fields[:1] in (["ok"], ["?"]) and len(fields) > 1:
            targets += [(fields[1], name) for name in names]
            names = []
    assert not names, f"fuzz targets listed without their package:\n{listing}"
    return targets


def test_fuzz_targets() -> None:
    """Each fuzz target for FUZZ_TIME inputs; the first that fails is reported with its output (and go writes the input
    that failed under the package's testdata/fuzz, to be kept as a regression case)."""
    go = go_command()
    targets = fuzz_targets(run([go, "test", "-list", "^Fuzz", "./..."], BUILD_S))
    assert targets, "sdk-go has no fuzz targets (go test -list '^Fuzz' ./... lists none): frame decoding must be fuzzed"
    for package, name in targets:
        run([go, "test", "-run=^$", f"-fuzz=^{name}$", f"-fuzztime={FUZZ_TIME}",
             f"-fuzzminimizetime={FUZZ_MINIMIZE_TIME}", package], BUILD_S)

"""docs/deploy.md's "etcd mode by hand" run as pasted: three etcd members, two registry nodes, two routers
and the console, each the documented command in one bash shell, with only the documented ports remapped
to free ones. `agentreach status` must then show what the block's last step promises: two nodes, one
leader, three healthy etcd endpoints and two routers at 50 % each."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from pathlib import Path

from conftest import wait_for
from doc_support import ROOT, VENV_BIN
from sdk_support import free_port

DEPLOY = ROOT / "docs" / "deploy.md"
PORTS = (2379, 22379, 32379, 12380, 22380, 32380, 8080, 8081, 8082, 8083, 8090)


def by_hand_block() -> str:
    text = DEPLOY.read_text()
    start = text.index("```bash\n# 1. etcd") + len("```bash\n")
    return text[start:text.index("```", start)]


def on_free_ports(block: str) -> tuple[str, dict[int, int]]:
    ports = {port: free_port() for port in PORTS}
    return re.sub(r"\b(" + "|".join(map(str, PORTS)) + r")\b", lambda m: str(ports[int(m.group(1))]), block), ports


async def status(registries: str, cwd: Path) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, [str(VENV_BIN / "agentreach"), "status", "--registry", registries,
                                                    "--data-dir", "keys"], capture_output=True, text=True, cwd=cwd,
                                   timeout=60)


async def test_etcd_mode_by_hand_runs_as_pasted(tmp_path):
    block, ports = on_free_ports(by_hand_block())
    # The block's steps 1-3 start the mesh; its last line (status) is checked below with a deadline.
    steps = block[:block.index("# 4. Check")]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AGENTREACH_")}
    environment["PATH"] = f"{VENV_BIN}:{environment['PATH']}"
    log = (tmp_path / "mesh.log").open("w")
    shell = subprocess.Popen(["bash", "-e", "-c", steps + "wait\n"], cwd=tmp_path, env=environment,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        registries = f"http://127.0.0.1:{ports[8081]},http://127.0.0.1:{ports[8083]}"

        async def as_promised() -> subprocess.CompletedProcess | None:
            assert shell.poll() is None, (tmp_path / "mesh.log").read_text()[-3000:]
            result = await status(registries, tmp_path)
            lines = result.stdout.splitlines()
            routers = [line.split() for line in lines if line.startswith("  ") and line.endswith("50 %")]
            promised = (result.returncode == 0 and "Registry nodes (2)" in lines
                        and "etcd endpoints (3 of 3 healthy)" in lines and len(routers) == 2)
            return result if promised else None
        result = await wait_for(as_promised, timeout=60, interval=0.5, what="the status the deploy doc promises")
        assert result.stdout.startswith("Cluster as registry node ") and "etcd store" in result.stdout.splitlines()[0]
        assert f"http://127.0.0.1:{ports[8081]}" in result.stdout and f"http://127.0.0.1:{ports[8083]}" in result.stdout
    finally:
        await stop_group(shell)
        log.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def stop_group(shell: subprocess.Popen) -> None:
    """Every process the block started (the shell's process group): asked to stop, killed if one will not.
    The shell is reaped first: as a zombie it would keep the group alive."""
    os.killpg(shell.pid, signal.SIGTERM)
    try:
        await wait_for(lambda: shell.poll() is not None and not group_alive(shell.pid), timeout=20, interval=0.1,
                       what="the mesh to stop")
    except AssertionError:
        os.killpg(shell.pid, signal.SIGKILL)
        raise

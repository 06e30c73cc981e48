"""compose.yaml, tested as a file: compose accepts it, and the mesh it describes, run as local processes
with its own commands, environment and healthchecks, routes a call through each router."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from compose_support import COMPOSE_FILE, ROOT, LocalMesh, resolved
from conftest import wait_for
from router_support import capability

ADMIN_KEY = "ara_compose-test-admin-key"


def test_compose_accepts_the_file_and_refuses_it_without_the_admin_key():
    def config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        environment = {key: value for key, value in os.environ.items() if key != "AGENTREACH_ADMIN_KEY"}
        return subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"], capture_output=True,
                              text=True, cwd=ROOT, env={**environment, **env}, timeout=60)

    accepted = config({"AGENTREACH_ADMIN_KEY": ADMIN_KEY})
    assert accepted.returncode == 0, accepted.stderr
    refused = config({})
    assert refused.returncode != 0 and "AGENTREACH_ADMIN_KEY" in refused.stderr


async def test_the_composed_mesh_routes_a_call_through_each_router(tmp_path: Path, start_agent, http):
    mesh = LocalMesh(resolved({"AGENTREACH_ADMIN_KEY": ADMIN_KEY}), tmp_path)
    assert {"etcd1", "etcd2", "etcd3", "registry1", "registry2", "router1", "router2", "console"} == set(mesh.services)
    # What the operator does first (docs/deploy.md): the admin key in the registries' shared keys dir.
    keys = Path(mesh.localise("registry1", "/var/lib/agentreach/keys"))
    keys.mkdir(parents=True, exist_ok=True)
    (keys / "admin.key").write_text(ADMIN_KEY + "\n")
    try:
        await mesh.up()
        agent = await start_agent("composed-1")
        registration = {"agent_id": agent.name, "service": "echo", "metadata": {},
                        "capabilities": [capability("echo", agent.endpoint)]}
        # Registered on one registry, known to both through etcd: each router follows them.
        async with http.post(f"{mesh.url('registry2', 8081)}/register", headers={"X-API-Key": ADMIN_KEY},
                             json=registration) as response:
            assert response.status == 200, await response.text()
        created = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "agentreach.cli", "clients", "create", "--name", "composed",
                             "--trust", "internal", "--grant", "echo", "--registry", mesh.url("registry1", 8081),
                             "--admin-key", ADMIN_KEY], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert created.returncode == 0, created.stderr
        api_key = json.loads(created.stdout)["api_key"]
        for router in ("router1", "router2"):
            async def routed(router: str = router) -> dict | None:
                async with http.post(f"{mesh.url(router, 8080)}/atp", headers={"X-API-Key": api_key},
                                     json={"capability": "echo", "payload": router}) as response:
                    return await response.json() if response.status == 200 else None

            answer = await wait_for(routed, timeout=10, what=f"{router} to route echo")
            assert answer["result"] == {"echo": router, "agent": "composed-1"}, answer
        async with http.get(f"{mesh.url('console', 8090)}/healthz") as response:
            assert response.status == 200
    finally:
        await asyncio.to_thread(mesh.stop)

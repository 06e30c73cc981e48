"""compose.yaml, tested as a file: compose accepts it, and the mesh it describes, run as local processes
with its own commands, environment and healthchecks, routes a call through each router, to an HTTP agent and
to an mq agent on the file's redis broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from compose_support import COMPOSE_FILE, ROOT, LocalMesh, entrypoint, resolved
from conftest import wait_for
from router_support import capability
from sdk_support import issue_token, read_log_until, spawn_example

ADMIN_KEY = "ara_compose-test-admin-key"


class ComposedMesh(LocalMesh):
    """LocalMesh, with redis-server's `--bind 0.0.0.0` kept on loopback as `--host 0.0.0.0` is."""

    def command(self, service: str, words: list[str]) -> list[str]:
        local = super().command(service, words)
        return ["127.0.0.1" if (before, word) == ("--bind", "0.0.0.0") else word
                for before, word in zip(["", *local], local, strict=False)]


def without_admin_key() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "AGENTREACH_ADMIN_KEY"}


def test_compose_accepts_the_file_with_or_without_the_admin_key():
    """The file holds no secret, so it validates before the operator has made .env (docs/deploy.md)."""
    for env in ({"AGENTREACH_ADMIN_KEY": ADMIN_KEY}, {}):
        accepted = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"], capture_output=True,
                                  text=True, cwd=ROOT, env={**without_admin_key(), **env}, timeout=60)
        assert accepted.returncode == 0, accepted.stderr


def test_a_router_without_the_admin_key_refuses_to_start_in_one_line(tmp_path: Path):
    """Without .env the key resolves empty: the router says what it lacks instead of running keyless."""
    mesh = LocalMesh(resolved({"AGENTREACH_ADMIN_KEY": ""}), tmp_path)
    spec = mesh.services["router1"]
    assert spec["environment"]["AGENTREACH_ADMIN_KEY"] == ""
    command = mesh.command("router1", [*entrypoint(), *spec["command"]])
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**without_admin_key(), **spec["environment"]})
    assert done.returncode == 2, done.stderr
    assert "AGENTREACH_ADMIN_KEY" in done.stderr and "Traceback" not in done.stderr


async def calls_the_demo_agents(mesh: LocalMesh, http) -> None:
    """The demo service minted its keys over the admin API into its volume; with the demo-caller key, a router
    reaches demo.echo, and order.query, whose agent calls intent.detect through a router with its own key."""
    caller = Path(mesh.localise("demo", "/var/lib/agentreach/demo")) / "demo" / "demo-caller.key"
    headers = {"X-API-Key": caller.read_text().strip()}
    calls = (("router1", "demo.echo", "hi"), ("router2", "order.query", {"text": "where is my order A-1002"}))
    for router, name, payload in calls:
        async def routed(router: str = router, name: str = name, payload: object = payload) -> dict | None:
            async with http.post(f"{mesh.url(router, 8080)}/atp", headers=headers,
                                 json={"capability": name, "payload": payload}) as response:
                return await response.json() if response.status == 200 else None

        answer = await wait_for(routed, timeout=10, what=f"{router} to route {name}")
        assert answer["status"] == "success", answer
    assert answer["result"] == {"order_id": "A-1002", "status": "packing"}, answer


async def calls_an_mq_agent(mesh: LocalMesh, http, api_key: str) -> None:
    """examples/mq_agent.py on the file's broker, as an agent on the compose network would run it: each router
    reaches it through redis (the routers' --broker is the broker the agent registered)."""
    broker = mesh.localise("router1", "redis://redis:6379")
    assert broker != "redis://redis:6379", "the redis service exposes no port 6379"
    token = (await issue_token(http, mesh.url("registry1", 8081), ADMIN_KEY, "mq-echo"))["token"]
    agent = await spawn_example("mq_agent.py", "--registry", mesh.url("registry1", 8081), "--broker", broker,
                                "--port", "0", "--agent-id", "composed-mq-1", "--token", token)
    try:
        await read_log_until(agent, "mq consumer started", timeout=20)
        for router in ("router1", "router2"):
            async def routed(router: str = router) -> dict | None:
                async with http.post(f"{mesh.url(router, 8080)}/atp", headers={"X-API-Key": api_key},
                                     json={"capability": "demo.mq.echo", "payload": {"text": router}}) as response:
                    return await response.json() if response.status == 200 else None

            answer = await wait_for(routed, timeout=15, what=f"{router} to route demo.mq.echo")
            assert answer["result"]["echo"] == {"text": router}, answer
            assert answer["route"]["instance"] == "composed-mq-1", answer
    finally:
        if agent.returncode is None:
            agent.kill()
        await agent.wait()


async def test_the_composed_mesh_routes_a_call_through_each_router(tmp_path: Path, start_agent, http):
    mesh = ComposedMesh(resolved({"AGENTREACH_ADMIN_KEY": ADMIN_KEY}), tmp_path)
    assert {"etcd1", "etcd2", "etcd3", "redis", "registry1", "registry2", "router1", "router2", "console",
            "demo"} == set(mesh.services)
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
                             "--trust", "internal", "--grant", "echo", "--grant", "demo.mq.*",
                             "--registry", mesh.url("registry1", 8081), "--admin-key", ADMIN_KEY],
            capture_output=True, text=True, cwd=ROOT, timeout=60)
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
        await calls_the_demo_agents(mesh, http)
        await calls_an_mq_agent(mesh, http, api_key)
    finally:
        await asyncio.to_thread(mesh.stop)

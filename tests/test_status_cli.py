"""`agentreach status` as a child process: a real registry's /cluster shown as a table or as JSON, the first
registry of a list that answers, and the exit codes a probe relies on (no registry answering, a stale view,
nobody leading) with the reason on stderr: against an embedded registry, against etcd-mode nodes on a
real 3-member etcd (a member killed, a node cut off from etcd), and against stand-in registries
(tests/cluster_support.py) for views that are hard to bring about on purpose (nobody leading, a 5xx)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

from cluster_support import DOWN_MEMBER, ClusterStandIn, Redirector, etcd_view
from conftest import admin_key, call, registration, wait_for
from recording_support import starting
from sdk_support import refused_url
from storage_support import AGENTREACH, ROOT

# Short leases and polls: a node cut off from etcd goes stale, and the other takes the lead, in seconds.
FAST = {"node_ttl": 2, "cluster_poll": 0.2, "gossip_interval": 0.2}


async def status(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run in a thread, so the registries this test's event loop serves keep answering."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("AGENTREACH_")}
    return await asyncio.to_thread(subprocess.run, [*AGENTREACH, "status", *args], capture_output=True, text=True,
                                   cwd=ROOT, env={**clean, **env}, timeout=60)



async def test_a_registry_is_shown_as_one_leading_node_from_the_first_url_that_answers(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    for name in ("a1", "a2"):
        status_code, _ = await call(http, "POST", f"{registry.url}/register", key,
                                    registration(name, "cap.x", service="svc"))
        assert status_code == 200
    _, view = await call(http, "GET", f"{registry.url}/cluster", key)
    dead = refused_url()
    result = await status("--registry", f"{dead},{registry.url}", "--admin-key", key)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (f"Cluster as registry node {view['node_id']} at {registry.url} sees it: embedded store "
                        "(its own write-ahead log), 2 live instances")
    assert lines[1] == f"Leader: {view['node_id']} (this node)"
    assert lines[2] == "View:   current"
    [row] = [line.split() for line in lines if line.startswith(f"  {view['node_id']}")]
    assert row[:4] == [view["node_id"], "(this", "node)", registry.url] and row[4] == "leader"
    assert "etcd endpoints: none (embedded store)" in lines and "Routers: none announced" in lines
    assert result.stderr.startswith(f"agentreach: cannot reach the registry at {dead}")
    assert result.stderr.count("\n") == 1


async def test_json_prints_the_registrys_view_and_the_environment_names_registry_and_key(start_registry, http):
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    _, view = await call(http, "GET", f"{registry.url}/cluster", key)
    result = await status("--json", AGENTREACH_REGISTRY=registry.url, AGENTREACH_ADMIN_KEY=key)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == view and result.stderr == ""


async def test_the_admin_key_is_required_by_an_auth_on_registry_but_not_by_an_auth_off_one(start_registry, tmp_path):
    guarded = await start_registry(tmp_path / "guarded", auth=True)
    wrong = await status("--registry", guarded.url, "--admin-key", "ara_wrong")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.startswith(f"agentreach: {guarded.url}: the registry refused: 401")
    keyless = await status("--registry", guarded.url, "--data-dir", str(tmp_path / "nothing"))
    assert keyless.returncode == 1 and "no admin key was sent: pass --admin-key" in keyless.stderr
    from_data_dir = await status("--registry", guarded.url, "--data-dir", str(guarded.settings.data_dir))
    assert from_data_dir.returncode == 0, from_data_dir.stderr
    open_registry = await start_registry(tmp_path / "open")
    assert (await status("--registry", open_registry.url, "--data-dir", str(tmp_path / "nothing"))).returncode == 0


async def test_no_registry_answering_exits_1_naming_each():
    first, second = refused_url(), refused_url()
    result = await status("--registry", f"{first},{second}", "--admin-key", "ara_x")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("agentreach: no registry answered: ")
    assert first in result.stderr and second in result.stderr and result.stderr.count("\n") == 1


async def test_a_bad_registry_flag_is_a_usage_error():
    result = await status("--registry", "127.0.0.1:8081", "--admin-key", "ara_x")
    assert result.returncode == 2 and "--registry must be http:// or https:// URLs" in result.stderr


async def test_an_etcd_cluster_shows_every_node_member_and_router():
    async with starting(ClusterStandIn) as start:
        registry = await start(etcd_view())
        result = await status("--registry", registry.url, "--admin-key", "ara_x")
    assert result.returncode == 0, result.stderr
    assert registry.received[0].headers["X-API-Key"] == "ara_x"
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"Cluster as registry node reg-a at {registry.url} sees it: etcd store, 42 live instances",
                         "Leader: reg-b", "View:   current"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  reg-")}
    assert rows["reg-a"][1:3] == ["(this", "node)"] and rows["reg-a"][4] == "follower"
    assert rows["reg-a"][-2:] == ["this", "node"]
    assert rows["reg-b"][2:] == ["leader", "10", "min", "0.4", "s", "ago"]
    assert "etcd endpoints (2 of 3 healthy)" in lines
    assert "  http://127.0.0.1:2379  ok      1.2 ms" in lines
    assert f"  {DOWN_MEMBER}  DOWN    connection refused" in lines
    assert [line.split() for line in lines if line.startswith("  router-")] == [
        ["router-1", "reg-a", "50", "%"], ["router-2", "reg-c", "50", "%"]]


async def test_a_stale_view_exits_4_and_nobody_leading_exits_3_saying_why():
    async with starting(ClusterStandIn) as start:
        cut_off = await start(etcd_view(leader=None, stale_seconds=12.3))
        leaderless = await start(etcd_view(leader=None))
        stale = await status("--registry", cut_off.url, "--admin-key", "ara_x")
        no_leader = await status("--registry", leaderless.url, "--admin-key", "ara_x")
        stale_json = await status("--json", "--registry", cut_off.url, "--admin-key", "ara_x")
    assert stale.returncode == 4
    assert "View:   STALE: last known current 12 s ago" in stale.stdout.splitlines()
    assert "Leader: NONE: nobody leads" in stale.stdout.splitlines()
    assert stale.stderr.splitlines() == [
        "agentreach: node reg-a's view is stale: last known current 12 s ago (cut off from etcd); ask another "
        "registry (http://127.0.0.12:8081, http://127.0.0.13:8081)",
        "agentreach: nobody leads: no health sweep or eviction runs until a node takes the lead"]
    assert no_leader.returncode == 3
    assert no_leader.stderr.splitlines() == [
        "agentreach: nobody leads: no health sweep or eviction runs until a node takes the lead"]
    assert stale_json.returncode == 4 and json.loads(stale_json.stdout)["stale_seconds"] == 12.3


async def test_a_node_answering_5xx_is_skipped_for_the_next():
    async with starting(ClusterStandIn) as start:
        failing = await start(status=503)
        healthy = await start(etcd_view(asked="reg-c"))
        result = await status("--registry", f"{failing.url},{healthy.url}", "--admin-key", "ara_x")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Cluster as registry node reg-c at {healthy.url}")
    assert result.stderr == (f"agentreach: {failing.url}: the registry refused: 503 storage_unavailable: "
                             "etcd has no quorum\n")


async def test_an_answer_that_is_no_cluster_view_fails_cleanly():
    async with starting(ClusterStandIn) as start:
        odd = await start(etcd_view())
        odd.view = None  # JSON null
        result = await status("--registry", odd.url, "--admin-key", "ara_x")
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"agentreach: {odd.url} answered something that is not a cluster view")


async def test_a_long_etcd_error_is_clipped_to_one_table_line_and_whole_in_json():
    view = etcd_view()
    reason = "ClientConnectorError(" + "ConnectionKey(host='127.0.0.1', port=2383), " * 8 + ")"
    view.etcd[2].error = reason
    async with starting(ClusterStandIn) as start:
        registry = await start(view)
        table = await status("--registry", registry.url, "--admin-key", "ara_x")
        raw = await status("--json", "--registry", registry.url, "--admin-key", "ara_x")
    [row] = [line for line in table.stdout.splitlines() if line.startswith(f"  {DOWN_MEMBER}")]
    assert row.endswith(reason[:59] + "…")
    assert json.loads(raw.stdout)["etcd"][2]["error"] == reason


async def test_etcd_mode_nodes_a_member_killed_and_a_node_cut_off(etcd_cluster, etcd_registry, relay, http):
    cluster = await etcd_cluster()
    link = await relay(cluster.client_ports[0])
    cut_off = await etcd_registry(cluster, [link.url], **FAST)
    other = await etcd_registry(cluster, **FAST)

    async def both_listed() -> bool:
        _, view = await call(http, "GET", f"{other.url}/cluster")
        return len(view["nodes"]) == 2 and view["leader"] is not None
    await wait_for(both_listed, timeout=15, what="both nodes listed with a leader")
    ids = {cut_off.url: cut_off.membership.node_id, other.url: other.membership.node_id}
    listed = await status("--registry", f"{other.url},{cut_off.url}")  # auth off: no key needed
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"Cluster as registry node {ids[other.url]} at {other.url} sees it: etcd store")
    assert "Registry nodes (2)" in listed.stdout and "etcd endpoints (3 of 3 healthy)" in listed.stdout
    for url, node_id in ids.items():
        assert any(line.split()[0] == node_id and url in line for line in listed.stdout.splitlines()[4:])

    cluster.kill(1)

    async def two_of_three() -> subprocess.CompletedProcess | None:  # once the other two have elected a leader
        result = await status("--registry", other.url)
        return result if "etcd endpoints (2 of 3 healthy)" in result.stdout else None
    member_down = await wait_for(two_of_three, timeout=15, what="two healthy etcd members of three")
    assert member_down.returncode == 0, member_down.stderr
    [down] = [line.split() for line in member_down.stdout.splitlines() if line.startswith(f"  {cluster.endpoints[1]}")]
    assert down[1] == "DOWN"

    await link.cut()

    async def says_stale() -> subprocess.CompletedProcess | None:
        result = await status("--registry", cut_off.url)
        return result if result.returncode == 4 else None
    stale = await wait_for(says_stale, timeout=15, what="the cut-off node's status to exit 4")
    assert "View:   STALE: last known current" in stale.stdout
    assert any(line.startswith("Leader: ") and line.endswith(" as last known") for line in stale.stdout.splitlines())
    assert stale.stderr.startswith(f"agentreach: node {ids[cut_off.url]}'s view is stale")
    assert f"ask another registry ({other.url})" in stale.stderr

    async def other_leads() -> subprocess.CompletedProcess | None:
        result = await status("--registry", other.url)
        return result if f"Leader: {ids[other.url]} (this node)" in result.stdout else None
    leading = await wait_for(other_leads, timeout=15, what="the other node to lead")
    assert leading.returncode == 0 and "View:   current" in leading.stdout, leading.stderr


async def test_a_redirect_is_not_followed_so_the_admin_key_goes_nowhere_else():
    async with starting(ClusterStandIn) as start, starting(Redirector) as start_redirector:
        elsewhere = await start(etcd_view())
        redirector = await start_redirector(elsewhere.url)
        result = await status("--registry", redirector.url, "--admin-key", "ara_secret")
    assert [received.headers.get("X-API-Key") for received in redirector.received] == ["ara_secret"]
    assert elsewhere.received == []
    assert result.returncode == 1 and "not a cluster view" in result.stderr

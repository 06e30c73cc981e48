"""The console's cluster view (issue 13 point 7): GET /api/cluster relays the registry's /cluster with the
console's admin key, and the home page's Cluster panel shows it in a real browser. A real mesh gives the
embedded one-node view; stand-in registries (tests/cluster_support.py) give etcd-mode views with a member
down, routers sharing the limits, a stale node and nobody leading."""

from __future__ import annotations

from playwright.async_api import expect

from cluster_support import DOWN_MEMBER, ClusterStandIn, Redirector, etcd_view
from conftest import call, wait_for
from console_support import Rig, screenshot
from recording_support import starting
from sdk_support import refused_url

WAIT_MS = 10_000


async def test_api_cluster_relays_the_registrys_view(rig: Rig):
    await rig.mesh.register("a1", [{"name": "echo", "version": "1.0", "protocol": "rest",
                                    "endpoint": "http://127.0.0.1:9/echo"}])
    _, view = await call(rig.http, "GET", f"{rig.mesh.registry.url}/cluster")
    assert await rig.get("/api/cluster") == view
    assert view["instances"] == 1 and view["nodes"][0]["url"] == rig.mesh.registry.url


async def test_api_cluster_needs_a_signed_in_operator_and_sends_the_admin_key(auth_rig: Rig):
    status, body = await call(auth_rig.http, "GET", f"{auth_rig.url}/api/cluster")
    assert status == 401 and body["error"]
    view = await auth_rig.get("/api/cluster")  # the rig signs in with the admin key
    assert view["leader"] == view["node_id"] and view["store"] == "wal"


async def test_api_cluster_follows_the_first_registry_that_answers(start_mesh, start_console, http):
    mesh = await start_mesh()
    rig = Rig(mesh, await start_console(f"{refused_url()},{mesh.registry.url}", mesh.url), http)
    assert (await rig.get("/api/cluster"))["nodes"][0]["url"] == mesh.registry.url
    nowhere = Rig(mesh, await start_console(refused_url(), mesh.url), http)
    status, body = await nowhere.request("GET", "/api/cluster")
    assert status == 502 and body["error"] == "upstream_unreachable"


async def test_a_registry_refusing_is_relayed_as_it_answered(start_mesh, start_console, http):
    mesh = await start_mesh()
    async with starting(ClusterStandIn) as start:
        failing = await start(status=503)
        rig = Rig(mesh, await start_console(failing.url, mesh.url), http)
        status, body = await rig.request("GET", "/api/cluster")
    assert (status, body["error"], body["message"]) == (503, "storage_unavailable", "etcd has no quorum")


async def test_the_home_page_shows_the_embedded_registry_as_one_leading_node(rig: Rig, page):
    _, view = await call(rig.http, "GET", f"{rig.mesh.registry.url}/cluster")
    await page.goto(f"{rig.url}/#/")
    panel = page.locator("#cluster")
    row = panel.locator(f'tr[data-key="{view["node_id"]}"]')
    await expect(row).to_contain_text("this node", timeout=WAIT_MS)
    await expect(row.locator(".badge")).to_have_text("leader")
    await expect(row).to_contain_text(rig.mesh.registry.url)
    await expect(panel.locator('[data-fact="leader"] dd')).to_have_text(view["node_id"])
    await expect(panel.locator('[data-fact="store"] dd')).to_have_text("embedded")
    await expect(panel).to_contain_text("None: the embedded store keeps this registry's own write-ahead log.")
    routers = (await call(rig.http, "GET", f"{rig.mesh.registry.url}/cluster"))[1]["routers"]
    router_rows = panel.locator("#cluster-routers tbody tr[data-key]")
    await expect(router_rows).to_have_count(len(routers), timeout=WAIT_MS)
    for router in routers:  # routers announce themselves as issue 13 point 4 lands
        await expect(panel.locator(f'#cluster-routers tr[data-key="{router["router_id"]}"]')).to_contain_text(
            router["node_id"])
    await expect(panel.locator(".notice")).to_have_count(0)
    await screenshot(page, "cluster-embedded")


async def test_the_home_page_shows_an_etcd_cluster_and_warns_when_its_view_goes_stale(start_mesh, start_console,
                                                                                     http, page):
    mesh = await start_mesh()
    async with starting(ClusterStandIn) as start:
        registry = await start(etcd_view())
        rig = Rig(mesh, await start_console(registry.url, mesh.url), http)
        await page.goto(f"{rig.url}/#/")
        panel = page.locator("#cluster")
        await expect(panel.locator("tbody tr[data-key^='reg-']")).to_have_count(3, timeout=WAIT_MS)
        await expect(panel.locator('tr[data-key="reg-b"] .badge')).to_have_text("leader")
        await expect(panel.locator('tr[data-key="reg-a"]')).to_contain_text("this node")
        await expect(panel.locator('[data-fact="leader"] dd')).to_have_text("reg-b")
        await expect(panel.locator('[data-fact="etcd"] dd')).to_have_text("2 of 3")
        down = panel.locator(f'tr[data-key="{DOWN_MEMBER}"]')
        await expect(down.locator(".badge")).to_have_text("down")
        await expect(down).to_contain_text("connection refused")
        await expect(panel.locator('tr[data-key="http://127.0.0.1:2379"]')).to_contain_text("1.3 ms")
        await expect(panel.locator('tr[data-key="router-2"]')).to_contain_text("reg-c")
        await expect(panel.locator('tr[data-key="router-2"]')).to_contain_text("50.0 %")
        await expect(panel.locator(".notice")).to_have_count(0)
        await screenshot(page, "cluster-etcd")
        registry.view = etcd_view(leader=None, stale_seconds=12.0)
        reason = "ClientConnectorError(" + "ConnectionKey(host='127.0.0.1', port=2383), " * 8 + ")"
        registry.view.etcd[2].error = reason
        warnings = panel.locator(".notice.bad")
        await expect(warnings).to_have_count(2, timeout=WAIT_MS)
        await expect(warnings.first).to_contain_text("Stale view: node reg-a was last known current 12 s ago")
        await expect(warnings.nth(1)).to_contain_text("Nobody leads")
        await expect(panel.locator('[data-fact="leader"] dd')).to_have_text("nobody leads")
        registry.view = etcd_view(stale_seconds=30.0)
        await expect(panel.locator('[data-fact="leader"] dt')).to_have_text("Leader, as last known", timeout=WAIT_MS)
        await expect(panel.locator('[data-fact="leader"] dd')).to_have_text("reg-b")
        registry.view = etcd_view(leader=None, stale_seconds=12.0)
        registry.view.etcd[2].error = reason
        await expect(panel.locator('[data-fact="leader"] dd')).to_have_text("nobody leads", timeout=WAIT_MS)
        clipped = down.locator(".clip")
        await expect(clipped).to_have_attribute("title", reason)
        assert await clipped.evaluate("(el) => el.scrollWidth > el.clientWidth")  # one line, cut short
        await screenshot(page, "cluster-stale")


async def test_the_console_follows_no_redirect_so_its_admin_key_goes_nowhere_else(start_mesh, start_console, http):
    mesh = await start_mesh()
    async with starting(ClusterStandIn) as start, starting(Redirector) as start_redirector:
        elsewhere = await start(etcd_view())
        redirector = await start_redirector(elsewhere.url)
        rig = Rig(mesh, await start_console(redirector.url, mesh.url, admin_key="ara_secret"), http)
        status, body = await rig.request("GET", "/api/cluster")
        await wait_for(lambda: len(redirector.received) > 1, what="the console's poll of the registry too")
    assert (status, body["error"]) == (502, "upstream_redirected")
    assert f"a redirect to '{elsewhere.url}/cluster'" in body["message"]
    assert {received.headers.get("X-API-Key") for received in redirector.received} == {"ara_secret"}
    assert elsewhere.received == []

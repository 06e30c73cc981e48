// The home page's Cluster panel: the registry nodes and which leads, etcd's members and their health,
// the routers and their share of every limit, as the registry the console follows sees it (/api/cluster).
// A node cut off from etcd says its view is stale: the panel says so first, above everything it shows.

import { call } from "./api.js";
import { h, replace, table, badge } from "./dom.js";
import { refreshOnTick } from "./refresh.js";
import * as fmt from "./format.js";

function seconds(value) {
  return fmt.age(value * 1000);
}

function nodesTable(view) {
  return table([
    { label: "Node", rowHeader: true, cell: (n) => h("span", {}, n.node_id, n.this_node ? h("span", { class: "tag", text: "this node" }) : null) },
    { label: "URL", cell: (n) => h("code", { text: n.url }) },
    { label: "Role", cell: (n) => badge(n.leader ? "leader" : "follower") },
    { label: "Started", cell: (n) => h("span", { title: fmt.dateTime(n.started_at), text: fmt.age(Date.now() - n.started_at * 1000) }) },
    { label: "Last heard", cell: (n) => (n.this_node ? "—" : seconds(n.last_heard)) },
  ], view.nodes, { caption: "Registry nodes", rowKey: (n) => n.node_id, empty: "No registry node holds a lease." });
}

function etcdTable(view) {
  if (view.store === "wal") return h("p", { class: "muted", text: "None: the embedded store keeps this registry's own write-ahead log." });
  return table([
    { label: "Endpoint", rowHeader: true, cell: (e) => h("code", { text: e.url }) },
    { label: "Health", cell: (e) => badge(e.healthy ? "healthy" : "down") },
    { label: "Round trip", numeric: true, cell: (e) => (e.healthy ? fmt.ms(e.rtt_ms) : h("span", { class: "clip", title: e.error, text: e.error || "—" })) },
  ], view.etcd, { caption: "etcd endpoints", rowKey: (e) => e.url, empty: "No etcd endpoint known." });
}

function routersTable(view) {
  return table([
    { label: "Router", rowHeader: true, cell: (r) => r.router_id },
    { label: "Follows", cell: (r) => r.node_id },
    { label: "Share of limits", numeric: true, cell: (r) => fmt.percent(r.share) },
  ], view.routers, { caption: "Routers", rowKey: (r) => r.router_id, empty: "No router has announced itself." });
}

function summary(view) {
  const healthy = view.etcd.filter((e) => e.healthy).length;
  return h("dl", { class: "triad", id: "cluster-summary" },
    h("div", { dataset: { fact: "leader" } }, h("dt", { text: stale(view) && view.leader ? "Leader, as last known" : "Leader" }),
      h("dd", { class: view.leader ? "" : "bad-text", text: view.leader ?? "nobody leads" })),
    h("div", { dataset: { fact: "store" } }, h("dt", { text: "Store" }), h("dd", { text: view.store === "etcd" ? "etcd" : "embedded" })),
    h("div", { dataset: { fact: "etcd" } }, h("dt", { text: "etcd healthy" }),
      h("dd", { class: healthy < view.etcd.length ? "bad-text" : "", text: view.store === "etcd" ? `${healthy} of ${view.etcd.length}` : "—" })),
    h("div", { dataset: { fact: "instances" } }, h("dt", { text: "Live instances" }), h("dd", { text: fmt.count(view.instances) })));
}

function stale(view) {
  return view.stale_seconds !== null && view.stale_seconds !== undefined;
}

function warnings(view) {
  const found = [];
  if (stale(view)) {
    found.push(`Stale view: node ${view.node_id} was last known current ${seconds(view.stale_seconds)}. It is cut off from etcd, so what it shows may be out of date.`);
  }
  if (!view.leader) found.push("Nobody leads: no health sweep or eviction runs until a registry node takes the lead.");
  return found.map((text) => h("p", { class: "notice bad", role: "alert", text }));
}

export function clusterPanel(live) {
  const body = h("div", { class: "cluster-body" }, h("p", { class: "muted", text: "Asking the registry…" }));
  const note = h("p", { class: "card-note" });
  const element = h("section", { class: "card", id: "cluster", "aria-labelledby": "cluster-title" },
    h("div", { class: "card-head" }, h("h2", { id: "cluster-title", text: "Cluster" }), note), body);

  let lastKey = "";
  async function refresh() {
    const answer = await call("/api/cluster");
    const key = JSON.stringify([answer.status, answer.body]);
    if (key === lastKey) return;
    lastKey = key;
    if (!answer.ok) {
      note.textContent = "";
      replace(body, h("p", { class: "notice bad", role: "alert", text: `Cannot read the cluster: ${answer.body?.message || `HTTP ${answer.status}`}` }));
      return;
    }
    const view = answer.body;
    note.textContent = `As registry node ${view.node_id} sees it.`;
    replace(body, warnings(view), summary(view),
      h("div", { id: "cluster-nodes" }, h("h3", { text: `Registry nodes (${view.nodes.length})` }), nodesTable(view)),
      h("div", { class: "grid-2" },
        h("div", { id: "cluster-etcd" }, h("h3", { text: "etcd endpoints" }), etcdTable(view)),
        h("div", { id: "cluster-routers" }, h("h3", { text: `Routers (${view.routers.length})` }), routersTable(view))));
  }
  return { element, stop: refreshOnTick(live, refresh, 2) };
}

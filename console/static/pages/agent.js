// One agent: what it offers, its heartbeats as the console saw them, and what it served
// (per capability QPS, P95 / P99, tokens, errors) now and hour by hour.

import { get } from "../lib/api.js";
import { h, replace, card, table, badge, url } from "../lib/dom.js";
import { beatTimeline, windowStart } from "../lib/charts.js";
import { refreshOnTick } from "../lib/refresh.js";
import { qualityCard } from "../lib/quality.js";
import * as fmt from "../lib/format.js";

const HISTORY_SECONDS = 300;

function facts(agent) {
  const m = agent.metadata || {};
  const rows = [
    ["Service", agent.service], ["Zone", m.zone || fmt.DASH], ["Model", m.model || fmt.DASH],
    ["Version", m.semver || fmt.DASH], ["Max QPS", m.max_qps ?? fmt.DASH],
    ["Last heartbeat", fmt.age(agent.last_heartbeat_ms_ago)], ["Load", fmt.load(agent.load)],
    ["In flight", agent.inflight ?? fmt.DASH], ["Health", agent.health || fmt.DASH],
    ["Failed checks", agent.failed_checks], ["Registered", fmt.dateTime(agent.registered_at)],
    ["Health URL", url(agent.health_url)], ["Direct fallback", agent.direct_fallback ? "yes" : "no"],
  ];
  return h("dl", { class: "facts" }, rows.map(([k, v]) => h("div", {}, h("dt", { text: k }), h("dd", {}, v))));
}

function errorsText(byCode) {
  const parts = Object.entries(byCode || {}).map(([code, n]) => `${code} ×${n}`);
  return parts.length ? parts.join(", ") : fmt.DASH;
}

function capabilityTable(agent, stats) {
  return table([
    { label: "Capability", rowHeader: true, cell: (c) => h("code", { text: c.name }) },
    { label: "Version", cell: (c) => c.version },
    { label: "Protocol", cell: (c) => c.protocol },
    { label: "SLA", numeric: true, cell: (c) => fmt.ms(c.timeout_sla_ms) },
    { label: "QPS", numeric: true, cell: (c) => fmt.rate(stats[c.name]?.qps ?? 0) },
    { label: "P95", numeric: true, cell: (c) => fmt.ms(stats[c.name]?.latency_p95_ms) },
    { label: "P99", numeric: true, cell: (c) => fmt.ms(stats[c.name]?.latency_p99_ms) },
    { label: "Tokens", numeric: true, cell: (c) => fmt.count(stats[c.name]?.tokens ?? 0) },
    { label: "Cost", numeric: true, cell: (c) => fmt.cost(stats[c.name]?.cost ?? 0) },
    { label: "Errors", cell: (c) => errorsText(stats[c.name]?.errors_by_code) },
    { label: "Endpoint", cell: (c) => url(c.endpoint) },
  ], agent.capabilities, { caption: "Capabilities and their traffic", empty: "No capability." });
}

function hoursTable(hours) {
  return table([
    { label: "Hour", rowHeader: true, cell: (r) => fmt.hourLabel(r.hour) },
    { label: "Attempts", numeric: true, cell: (r) => fmt.count(r.total) },
    { label: "Errors", numeric: true, cell: (r) => fmt.count(r.failed) },
    { label: "Tokens", numeric: true, cell: (r) => fmt.count(r.tokens) },
    { label: "Cost", numeric: true, cell: (r) => fmt.cost(r.cost) },
    { label: "P95", numeric: true, cell: (r) => fmt.ms(r.latency_p95_ms) },
    { label: "P99", numeric: true, cell: (r) => fmt.ms(r.latency_p99_ms) },
  ], [...hours].reverse(), { caption: "Hourly history", empty: "No traffic recorded for this agent in the last 24 hours." });
}

export async function render(main, { params, live }) {
  const id = params.id;
  const head = h("div", { class: "page-head" }, h("p", { class: "crumbs" }, h("a", { href: "#/agents", text: "Agents" }), " / "),
    h("h1", { text: id }));
  const body = h("div", { class: "agent-body" }, h("p", { class: "loading", text: "Loading…" }));
  // Outside the refreshed body: an operator's half-typed score survives the page's refreshes.
  const quality = h("div");
  replace(main, head, body, quality);

  async function refresh() {
    let detail;
    try {
      detail = await get(`/api/agents/${encodeURIComponent(id)}`);
    } catch (error) {
      replace(body, h("p", { class: "notice bad", role: "alert", text: error.message }));
      return;
    }
    const { agent, traffic } = detail;
    if (!quality.childElementCount) replace(quality, qualityCard(id, agent.capabilities.map((c) => c.name)));
    replace(head.querySelector("h1"), id, " ", badge(agent.state));
    const now = Date.now() / 1000;
    const timeline = h("div", { class: "chart" });
    const served = card("Served lately", { id: "traffic", note: "QPS over 60 s; the rest over 5 min, from the router's traces." },
      h("dl", { class: "triad" },
        h("div", {}, h("dt", { text: "QPS" }), h("dd", { text: fmt.rate(traffic.qps) })),
        h("div", {}, h("dt", { text: "P95" }), h("dd", { text: fmt.ms(traffic.latency_p95_ms) })),
        h("div", {}, h("dt", { text: "P99" }), h("dd", { text: fmt.ms(traffic.latency_p99_ms) })),
        h("div", {}, h("dt", { text: "Tokens" }), h("dd", { text: fmt.count(traffic.tokens) })),
        h("div", {}, h("dt", { text: "Cost" }), h("dd", { text: fmt.cost(traffic.cost) })),
        h("div", {}, h("dt", { text: "Errors" }), h("dd", { text: fmt.count(traffic.errors) }))),
      h("p", { class: "muted", text: `Errors by code: ${errorsText(traffic.errors_by_code)}` }));
    const beats = card("Heartbeat history", { id: "heartbeats", note: `Up to the last ${HISTORY_SECONDS / 60} minutes, as the console saw each beat arrive; the line is the load each beat reported.` },
      timeline,
      h("h3", { text: "State changes" }),
      detail.transitions.length
        ? h("ol", { class: "transitions" }, [...detail.transitions].reverse().map((t) =>
          h("li", {}, h("time", { text: fmt.clock(t.at, true) }), " ", t.previous ? badge(t.previous) : "first seen", " → ", badge(t.state))))
        : h("p", { class: "muted", text: "No change seen yet." }));
    replace(body,
      h("div", { class: "grid-2 wide-right" },
        card("Instance", { id: "facts" }, facts(agent)),
        h("div", { class: "stack" }, served, beats)),
      card("Capabilities", { id: "capabilities" }, capabilityTable(agent, detail.capabilities)),
      card("Last 24 hours", { id: "hours" }, hoursTable(detail.hours)));
    const from = windowStart(detail.heartbeats.map((b) => b.at), now, HISTORY_SECONDS, 60);
    beatTimeline(timeline, { label: `Heartbeats and load of ${id}`, beats: detail.heartbeats, from, to: now });
  }

  await refresh();
  return refreshOnTick(live, refresh, 2);
}

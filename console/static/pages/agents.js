// The agent view: every instance with its registry state and the traffic it served lately
// (QPS over 60 s; P95 / P99, tokens, their cost and errors over 5 min, from the router's traces).

import { h, replace, table, badge, field } from "../lib/dom.js";
import { keepFocus } from "../lib/live-table.js";
import * as fmt from "../lib/format.js";

export function agentLink(id) {
  return h("a", { href: `#/agents/${encodeURIComponent(id)}`, text: id });
}

const COLUMNS = [
  { label: "Agent", rowHeader: true, cell: (a) => agentLink(a.agent_id) },
  { label: "Service", cell: (a) => a.service },
  { label: "Capabilities", cell: (a) => h("span", { class: "caps" }, a.capabilities.map((c) => h("code", { text: c }))) },
  { label: "State", cell: (a) => badge(a.state) },
  { label: "Last heartbeat", cell: (a) => fmt.age(a.heartbeat_age_ms) },
  { label: "Load", numeric: true, cell: (a) => fmt.load(a.load) },
  { label: "Zone", cell: (a) => a.zone ?? fmt.DASH },
  { label: "Model", cell: (a) => a.model ?? fmt.DASH },
  { label: "QPS", numeric: true, cell: (a) => fmt.rate(a.traffic.qps) },
  { label: "P95", numeric: true, cell: (a) => fmt.ms(a.traffic.latency_p95_ms) },
  { label: "P99", numeric: true, cell: (a) => fmt.ms(a.traffic.latency_p99_ms) },
  { label: "Tokens", numeric: true, cell: (a) => fmt.count(a.traffic.tokens) },
  { label: "Cost", numeric: true, cell: (a) => fmt.cost(a.traffic.cost) },
  { label: "Errors", numeric: true, cell: (a) => h("span", { class: a.traffic.errors ? "bad-text" : "", text: fmt.count(a.traffic.errors) }) },
];

export async function render(main, { live }) {
  const search = h("input", { type: "search", placeholder: "agent, service, capability, zone, model" });
  const state = h("select", {}, ["all", "healthy", "pending", "demoted", "evicted"].map((s) => h("option", { value: s, text: s })));
  const summary = h("p", { class: "page-sub", "aria-live": "polite" });
  const holder = h("div", { id: "agents-table" });
  let latest = [];

  function draw() {
    const words = search.value.trim().toLowerCase();
    const shown = latest.filter((a) => (state.value === "all" || a.state === state.value) &&
      (!words || [a.agent_id, a.service, a.zone, a.model, ...a.capabilities].join(" ").toLowerCase().includes(words)));
    summary.textContent = `${shown.length} of ${latest.length} instances shown`;
    keepFocus(holder, () => replace(holder, table(COLUMNS, shown, {
      caption: "Agent instances", rowKey: (a) => a.agent_id,
      empty: latest.length ? "No instance matches the filter." : "No agent has registered yet.",
    })));
  }

  search.addEventListener("input", draw);
  state.addEventListener("change", draw);
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Agents" }), summary),
    h("form", { class: "filters", role: "search", "aria-label": "Filter agents", onsubmit: (e) => e.preventDefault() },
      field("Filter", search, { name: "q" }), field("State", state, { name: "state" })),
    h("section", { class: "card", "aria-label": "Agent instances" }, holder));
  return live.on("agents", (data) => { latest = data.agents; draw(); });
}

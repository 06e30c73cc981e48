// The route view: how the router decided, counted by policy and by what it had to do
// (hash, least-load, affinity; failover, fallback, demoted), since it started and per hour.

import { call, get } from "../lib/api.js";
import { h, replace, card, table } from "../lib/dom.js";
import { columnChart, timeSlots, windowStart } from "../lib/charts.js";
import { refreshOnTick } from "../lib/refresh.js";
import * as fmt from "../lib/format.js";
import { scoresCard } from "../lib/scores.js";

// [decision, label, colour]: one colour per decision, the same in the bars and the hourly chart.
// Always listed: how the router picks and rescues.
const KNOWN = [
  ["least_load", "Least load", "s-cat0"], ["hash", "Consistent hash", "s-cat2"], ["affinity", "Affinity", "s-cat6"],
  ["failover", "Failover", "s-cat3"], ["fallback", "Fallback capability", "s-cat4"], ["demoted", "Demoted instance", "s-cat7"],
  ["semantic", "Semantic match", "s-cat1"], ["unknown_capability", "Unknown capability", "s-cat5"],
];
// Listed once they happen: calls the router answered itself, without routing them.
const OCCASIONAL = [
  ["intent_unmatched", "Intent matched nothing", "s-cat5"], ["intent_ambiguous", "Intent ambiguous", "s-cat5"],
  ["fallback_refused", "Fallback refused", "s-cat4"], ["unauthenticated", "Refused: no valid credential", "s-cat5"],
  ["forbidden", "Refused: not granted", "s-cat5"], ["trust_level_insufficient", "Refused: trust level too low", "s-cat5"],
  ["rate_limited", "Refused: over its rate", "s-cat5"],
];
const LABELS = Object.fromEntries([...KNOWN, ...OCCASIONAL].map(([key, label]) => [key, label]));
const COLOURS = Object.fromEntries([...KNOWN, ...OCCASIONAL].map(([key, , colour]) => [key, colour]));
const colour = (key) => COLOURS[key] || "s-cat7";
// A decision this page does not know yet still reads as words: "some_new_kind" → "Some new kind".
const label = (key) => LABELS[key] || `${key[0].toUpperCase()}${key.slice(1).replace(/_/g, " ")}`;

function ordered(decisions) {
  const always = KNOWN.map(([key]) => key);
  const keys = [...always, ...Object.keys(decisions).filter((k) => !always.includes(k) && decisions[k]).sort()];
  return keys.map((key) => [key, decisions[key] || 0]);
}

function bars(decisions) {
  const rows = ordered(decisions);
  const max = Math.max(1, ...rows.map(([, n]) => n));
  return h("ul", { class: "bars", "aria-label": "Route decisions since the router started" }, rows.map(([key, n]) =>
    h("li", { dataset: { decision: key } },
      h("span", { class: "bar-label", text: label(key) }),
      h("span", { class: "bar-track", "aria-hidden": "true" }, h("span", { class: `bar-fill ${colour(key)}`, style: { width: `${(100 * n) / max}%` } })),
      h("span", { class: "bar-value num", text: fmt.count(n) }))));
}

export async function render(main, { live }) {
  const totals = h("div", { "aria-live": "polite" });
  const chart = h("div", { class: "chart" });
  const hourly = h("div");
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Routing" }),
      h("p", { class: "page-sub", text: "Which policy picked the instance, and how often the router had to rescue a call." })),
    h("div", { class: "grid-2 wide-right" },
      card("Decisions since the router started", { id: "decisions", note: "Policies choose; failover, fallback and demoted count rescues." }, totals),
      card("Decisions per hour, last 24 hours", { id: "decisions-day" }, chart)),
    card("Hour by hour", { id: "decisions-table" }, hourly));
  const policies = await call("/api/policies");
  const scores = scoresCard(policies.ok ? policies.body.policies.map((p) => p.capability) : []);
  main.append(scores.element);

  let lastKey = "";
  async function refresh() {
    await scores.refresh();
    const view = await get("/api/routes");
    const key = JSON.stringify(view);
    if (key === lastKey) return;
    lastKey = key;
    replace(totals, bars(view.decisions));
    const names = ordered(Object.assign({}, ...view.hours.map((r) => r.decisions))).filter(([, n]) => n).map(([k]) => k);
    const now = Date.now() / 1000;
    const from = windowStart(view.hours.map((r) => r.hour), now, 24 * 3600, 6 * 3600);
    const slots = timeSlots(view.hours, { from, to: now, step: 3600, at: (r) => r.hour });
    columnChart(chart, {
      label: "Route decisions per hour by kind", x: slots.map(([t]) => t),
      stacks: names.map((name) => ({ name: label(name), className: colour(name), values: slots.map(([, r]) => (r ? r.decisions[name] || 0 : 0)) })),
      yFormat: (v) => fmt.count(Math.round(v)), xFormat: (v) => fmt.clock(v), empty: "No decision recorded yet.",
    });
    replace(hourly, table([
      { label: "Hour", rowHeader: true, cell: (r) => fmt.hourLabel(r.hour) },
      ...names.map((name) => ({ label: label(name), numeric: true, cell: (r) => fmt.count(r.decisions[name] || 0) })),
    ], [...view.hours].reverse(), { caption: "Route decisions per hour", empty: "No decision recorded yet." }));
  }
  await refresh();
  return refreshOnTick(live, refresh, 2);
}

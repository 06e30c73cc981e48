// The reach view: global raw success, reach rate, instance health and call volume, live for the
// last hour (per router period) and hour by hour for the last day (from the console's store).

import { get } from "../lib/api.js";
import { h, replace, card, table } from "../lib/dom.js";
import { lineChart, columnChart, timeSlots, windowStart, outcomeStacks } from "../lib/charts.js";
import { refreshOnTick } from "../lib/refresh.js";
import { curveCharts, reachTone } from "./overview.js";
import * as fmt from "../lib/format.js";

function sum(points, key) {
  return points.reduce((total, p) => total + p[key], 0);
}

function figures(view) {
  const total = sum(view.points, "total");
  const success = sum(view.points, "success");
  const degraded = sum(view.points, "degraded");
  const reach = total ? (success + degraded) / total : null;
  const items = [
    ["Raw success rate", fmt.percent(total ? success / total : null), ""],
    ["Reach rate", fmt.percent(reach), reachTone(reach)],
    ["Instance health rate", fmt.percent(view.instance_health_rate), ""],
    ["Calls, last hour", fmt.count(total), ""],
  ];
  return h("div", { class: "stats" }, items.map(([label, value, tone]) =>
    h("div", { class: "stat", dataset: { tone } }, h("p", { class: "stat-label", text: label }), h("p", { class: "stat-value", text: value }))));
}

function capabilityTable(rows) {
  return table([
    { label: "Capability", rowHeader: true, cell: (c) => h("a", { href: `#/traces?capability=${encodeURIComponent(c.capability)}`, text: c.capability }) },
    { label: "Calls", numeric: true, cell: (c) => fmt.count(c.total) },
    { label: "Success", numeric: true, cell: (c) => fmt.count(c.success) },
    { label: "Degraded", numeric: true, cell: (c) => fmt.count(c.degraded) },
    { label: "Failed", numeric: true, cell: (c) => fmt.count(c.failed) },
    { label: "Failures by code", cell: (c) => Object.entries(c.failed_by_code).map(([k, v]) => `${k} ×${v}`).join(", ") || fmt.DASH },
    { label: "Raw success", numeric: true, cell: (c) => fmt.percent(c.raw_success_rate) },
    { label: "Reach", numeric: true, cell: (c) => h("span", { class: `tone-${reachTone(c.reach_rate)}`, text: fmt.percent(c.reach_rate) }) },
    { label: "P95", numeric: true, cell: (c) => fmt.ms(c.latency_p95_ms) },
    { label: "P99", numeric: true, cell: (c) => fmt.ms(c.latency_p99_ms) },
    { label: "Alert", cell: (c) => (c.alert ? h("span", { class: "badge badge-alert", text: "alerting" }) : fmt.DASH) },
  ], rows, { caption: "Reach by capability", empty: "No calls in the last hour." });
}

const DAY = 24 * 3600;

export function hourCharts(hours, { line, columns }, now = Date.now() / 1000) {
  const from = windowStart(hours.map((r) => r.hour), now, DAY, 6 * 3600);
  lineChart(line, {
    label: "Reach rate per hour, last 24 hours", xMin: from, xMax: now,
    series: [{ name: "Reach rate", className: "s-reach", points: hours.map((r) => [r.hour, r.reach_rate]) }],
    yMin: Math.min(0.9, ...hours.map((r) => r.reach_rate ?? 1)), yMax: 1,
    yFormat: (v) => fmt.percent(v, 0), xFormat: (v) => fmt.clock(v), threshold: { value: 0.98, label: "98 %" },
    empty: "No hour recorded yet: hours are folded in as the router closes its periods.",
  });
  const slots = timeSlots(hours, { from, to: now, step: 3600, at: (r) => r.hour });
  columnChart(columns, {
    label: "Calls per hour by outcome, last 24 hours", x: slots.map(([t]) => t),
    stacks: outcomeStacks(slots),
    yFormat: (v) => fmt.count(Math.round(v)), xFormat: (v) => fmt.clock(v), empty: "No hour recorded yet.",
  });
}

export async function render(main, { live }) {
  const numbers = h("div", { "aria-live": "polite" });
  const charts = { reach: h("div", { class: "chart" }), volume: h("div", { class: "chart" }), latency: h("div", { class: "chart" }) };
  const capabilities = h("div");
  const hourly = { line: h("div", { class: "chart" }), columns: h("div", { class: "chart" }) };
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Reach" }),
      h("p", { class: "page-sub", text: "Did the mesh deliver? Raw success, reach and instance health side by side." })),
    numbers,
    h("div", { class: "grid-2" },
      card("Reach rate, last hour", { id: "reach-hour" }, charts.reach),
      card("Call volume, last hour", { id: "volume-hour" }, charts.volume)),
    h("div", { class: "grid-2" },
      card("Latency percentiles, last hour", { id: "latency-hour" }, charts.latency),
      card("Reach rate, last 24 hours", { id: "reach-day", note: "Hourly aggregates kept by the console; they survive its restart." }, hourly.line)),
    card("By capability, last hour", { id: "by-capability" }, capabilities),
    card("Call volume, last 24 hours", { id: "volume-day" }, hourly.columns));

  let lastKey = "";
  async function refresh() {
    const view = await get("/api/reach");
    const key = JSON.stringify(view) + Math.floor(Date.now() / 10000);
    if (key === lastKey) return;
    lastKey = key;
    replace(numbers, figures(view));
    curveCharts(view.points, charts);
    replace(capabilities, capabilityTable(view.capabilities));
    hourCharts(view.hours, hourly);
  }
  await refresh();
  return refreshOnTick(live, refresh, 2);
}

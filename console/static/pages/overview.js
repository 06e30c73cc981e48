// Home: the four numbers (registered agents, available instances, calls per second, reach rate)
// and the last hour's reach curve, pushed live by the console every poll; under them, the cluster.

import { h, card, replace, badge } from "../lib/dom.js";
import { clusterPanel } from "../lib/cluster-panel.js";
import { lineChart, columnChart, timeSlots, windowStart, outcomeStacks } from "../lib/charts.js";
import * as fmt from "../lib/format.js";

const STATES = ["healthy", "pending", "demoted", "evicted"];

function stat(id, label) {
  return h("div", { class: "stat", id },
    h("p", { class: "stat-label", text: label }),
    h("p", { class: "stat-value", text: "—" }),
    h("p", { class: "stat-sub", text: "" }));
}

function setStat(root, id, value, sub, tone) {
  const el = root.querySelector(`#${id}`);
  el.querySelector(".stat-value").textContent = value;
  el.querySelector(".stat-sub").textContent = sub;
  el.dataset.tone = tone || "";
}

export function reachTone(value, threshold = 0.98) {
  if (value === null || value === undefined) return "";
  return value >= threshold ? "good" : value >= threshold - 0.05 ? "warn" : "bad";
}

const HOUR = 3600;

// The last hour on a fixed time axis ending now: reach vs raw success, volume by outcome, latency.
export function curveCharts(points, { reach, volume, latency }, now = Date.now() / 1000) {
  const time = (p) => p.start;
  const from = windowStart(points.map(time), now, HOUR, 15 * 60);
  const axis = { xMin: from, xMax: now, xFormat: (v) => fmt.clock(v) };
  lineChart(reach, {
    ...axis, label: "Reach rate and raw success rate per period, last hour",
    // Raw success is drawn last, dashed, so where it equals reach both lines still show.
    series: [
      { name: "Reach rate", className: "s-reach", points: points.map((p) => [time(p), p.reach_rate]) },
      { name: "Raw success rate", className: "s-raw", dashed: true, points: points.map((p) => [time(p), p.raw_success_rate]) },
    ],
    yMin: Math.min(0.9, ...points.map((p) => p.raw_success_rate ?? 1)), yMax: 1,
    yFormat: (v) => fmt.percent(v, 0), threshold: { value: 0.98, label: "alert threshold 98 %" },
    empty: "No calls in the last hour: the curve starts with the first call through the router.",
  });
  if (volume) {
    const step = points.length ? points[0].end - points[0].start : 60;
    const slots = timeSlots(points, { from, to: now, step });
    columnChart(volume, {
      label: "Calls per period by outcome, last hour", x: slots.map(([t]) => t),
      stacks: outcomeStacks(slots),
      yFormat: (v) => fmt.count(Math.round(v)), xFormat: (v) => fmt.clock(v), empty: "No calls in the last hour.",
    });
  }
  if (latency) lineChart(latency, {
    ...axis, label: "Latency percentiles per period, last hour",
    series: [
      { name: "P50", className: "s-p50", points: points.map((p) => [time(p), p.latency_p50_ms]) },
      { name: "P95", className: "s-p95", points: points.map((p) => [time(p), p.latency_p95_ms]) },
      { name: "P99", className: "s-p99", points: points.map((p) => [time(p), p.latency_p99_ms]) },
    ],
    yMin: 0, yFormat: (v) => fmt.ms(v), empty: "No calls in the last hour.",
  });
}

export async function render(main, { live }) {
  const updated = h("span", { class: "updated", text: "waiting for the first poll…" });
  const numbers = h("div", { class: "stats", "aria-live": "polite", "aria-label": "The mesh now" },
    stat("stat-agents", "Registered agents"), stat("stat-available", "Available instances"),
    stat("stat-cps", "Calls per second"), stat("stat-reach", "Reach rate"));
  const compare = h("dl", { class: "triad" });
  const states = h("ul", { class: "state-counts" });
  const alerts = h("p", { class: "alert-line" });
  const reachChart = h("div", { class: "chart", id: "reach-curve" });
  const volumeChart = h("div", { class: "chart" });
  const latencyChart = h("div", { class: "chart" });
  const cluster = clusterPanel(live);

  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Overview" }), h("p", { class: "page-sub" }, "Live · ", updated)),
    numbers,
    h("div", { class: "grid-2 wide-left" },
      card("Reach rate, last hour", { id: "curve", note: "Per router period. Reach counts calls the mesh delivered, degraded ones included; raw success (dashed, on top) does not." }, reachChart),
      card("Agent or mesh?", { id: "triad", note: "Side by side: if raw success is low but reach holds, the mesh is covering for agents." },
        compare, h("h3", { text: "Instances by state" }), states, alerts)),
    h("div", { class: "grid-2" },
      card("Calls per period", { id: "volume" }, volumeChart),
      card("Latency percentiles", { id: "latency" }, latencyChart)),
    cluster.element);

  let lastCurve = "";
  const stopNumbers = live.on("overview", (o) => {
    updated.textContent = `updated ${fmt.clock(o.at, true)}`;
    const pending = o.states.pending || 0, demoted = o.states.demoted || 0;
    setStat(numbers, "stat-agents", fmt.count(o.registered_agents), `${pending} pending · ${demoted} demoted`);
    setStat(numbers, "stat-available", fmt.count(o.available_instances),
      o.instance_health_rate === null ? "no instance registered" : `${fmt.percent(o.instance_health_rate)} of instances healthy`,
      o.registered_agents && o.available_instances === 0 ? "bad" : "");
    setStat(numbers, "stat-cps", fmt.rate(o.calls_per_second), "through the router, last 10 s");
    setStat(numbers, "stat-reach", fmt.percent(o.reach_rate),
      o.reach_rate === null ? "no calls in the last 5 min" : `last ${o.window_seconds / 60} min · raw success ${fmt.percent(o.raw_success_rate)}`,
      reachTone(o.reach_rate));
    replace(compare,
      h("div", {}, h("dt", { text: "Raw success" }), h("dd", { text: fmt.percent(o.raw_success_rate) })),
      h("div", {}, h("dt", { text: "Reach" }), h("dd", { text: fmt.percent(o.reach_rate) })),
      h("div", {}, h("dt", { text: "Instance health" }), h("dd", { text: fmt.percent(o.instance_health_rate) })));
    replace(states, STATES.map((s) => h("li", {}, badge(s), h("span", { class: "num", text: fmt.count(o.states[s] || 0) }))));
    replace(alerts, o.active_alerts
      ? h("a", { href: "#/alerts", class: "alert-link", text: `${o.active_alerts} active reach alert${o.active_alerts > 1 ? "s" : ""}` })
      : h("span", { class: "muted", text: "No active reach alert." }),
    o.quality_alerts ? [" ", h("a", { href: "#/alerts", class: "alert-link", text: `${o.quality_alerts} instance${o.quality_alerts > 1 ? "s" : ""} below quality floor` })] : null);
    const curveKey = JSON.stringify(o.curve) + Math.floor(o.at / 10);
    if (curveKey !== lastCurve) {
      lastCurve = curveKey;
      curveCharts(o.curve, { reach: reachChart, volume: volumeChart, latency: latencyChart }, o.at);
    }
  });
  return () => { stopNumbers(); cluster.stop(); };
}

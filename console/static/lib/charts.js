// Hand-made SVG charts: drawn at the container's real width (so text never stretches) and
// redrawn when it resizes. Each chart is an image with a label, and its numbers are also
// offered as a table for people who would rather read than look.

import { h, svg, replace } from "./dom.js";

const PAD = { top: 14, right: 16, bottom: 26, left: 56 };
const drawers = new WeakMap();
const resizes = new ResizeObserver((entries) => {
  for (const entry of entries) {
    const draw = drawers.get(entry.target);
    if (!entry.target.isConnected || !draw) resizes.unobserve(entry.target);
    else draw();
  }
});

function mount(container, draw) {
  drawers.set(container, draw);
  draw();
  resizes.observe(container);
}

// The round step (1, 2, 2.5 or 5 times a power of ten) that cuts a range into about ``parts`` parts.
function niceStep(range, parts) {
  if (!(range > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(range / parts));
  for (const step of [1, 2, 2.5, 5, 10]) if (range / (step * magnitude) <= parts + 1) return step * magnitude;
  return 10 * magnitude;
}

// Where a time axis ending now should start: ``span`` ago, or later while the data is younger
// than that (but never showing less than ``least``), so a fresh mesh is not a dot at the edge.
export function windowStart(times, now, span, least) {
  const first = times.length ? Math.min(...times) : now;
  return Math.max(now - span, Math.min(now - least, first));
}

// Rows on a regular time grid (periods, hours), with null where nothing happened, so an empty
// stretch shows as empty instead of being squeezed out.
export function timeSlots(rows, { from, to, step, at = (row) => row.start }) {
  const byTime = new Map(rows.map((row) => [Math.round(at(row) / step), row]));
  const slots = [];
  for (let t = Math.floor(from / step) * step; t <= to; t += step) slots.push([t, byTime.get(Math.round(t / step)) || null]);
  return slots;
}

function frame(width, height, label) {
  return svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, class: "chart-svg" },
    svg("title", { text: label }));
}

function yAxis(root, { width, height, yMin, yMax, yFormat, parts = 4 }) {
  const step = niceStep(yMax - yMin, parts);
  const low = Math.floor(yMin / step + 1e-9) * step;
  const high = Math.max(low + step, Math.ceil(yMax / step - 1e-9) * step);
  const inner = height - PAD.top - PAD.bottom;
  const y = (value) => PAD.top + inner - ((value - low) / (high - low)) * inner;
  for (let value = low; value <= high + step / 2; value += step) {
    const at = y(value);
    root.append(svg("line", { x1: PAD.left, x2: width - PAD.right, y1: at, y2: at, class: "grid" }),
      svg("text", { x: PAD.left - 8, y: at + 4, class: "tick", "text-anchor": "end", text: yFormat(value) }));
  }
  return y;
}

function xAxis(root, { width, height, xMin, xMax, xFormat, ticks }) {
  const inner = width - PAD.left - PAD.right;
  const x = (value) => PAD.left + ((value - xMin) / (xMax - xMin || 1)) * inner;
  const count = Math.max(2, Math.min(ticks, Math.floor(inner / 90)));
  for (let i = 0; i <= count; i++) {
    const value = xMin + ((xMax - xMin) * i) / count;
    root.append(svg("text", { x: x(value), y: height - 8, class: "tick", "text-anchor": i === 0 ? "start" : i === count ? "end" : "middle", text: xFormat(value) }));
  }
  return x;
}

function legend(series) {
  return h("ul", { class: "legend", "aria-hidden": "true" },
    series.map((s) => h("li", {}, h("span", { class: `swatch ${s.className}${s.dashed ? " dashed" : ""}` }), s.name)));
}

function dataTable(caption, headers, rows) {
  return h("details", { class: "chart-data" },
    h("summary", { text: "Show the numbers" }),
    h("div", { class: "table-wrap" }, h("table", {},
      h("caption", { class: "visually-hidden", text: caption }),
      h("thead", {}, h("tr", {}, headers.map((label) => h("th", { scope: "col", text: label })))),
      h("tbody", {}, rows.map((row) => h("tr", {}, row.map((cell) => h("td", { text: cell }))))))));
}

function emptyState(container, text) {
  replace(container, h("div", { class: "chart-empty", text }));
}

// Lines over time. series: [{name, className, points: [[x, y|null], ...]}]
export function lineChart(container, spec) {
  const { label, series, yFormat = String, xFormat = String, threshold, height = 220, empty = "No data yet." } = spec;
  const all = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] !== undefined));
  if (!all.length) return emptyState(container, empty);
  const plot = h("div", { class: "chart-plot" });
  replace(container, plot, legend(series),
    dataTable(label, ["time", ...series.map((s) => s.name)],
      series[0].points.map((p, i) => [xFormat(p[0]), ...series.map((s) => (s.points[i] && s.points[i][1] != null ? yFormat(s.points[i][1]) : "—"))])));
  mount(plot, () => {
    const width = Math.max(280, plot.clientWidth);
    const xs = all.map((p) => p[0]);
    let xMin = spec.xMin ?? Math.min(...xs);
    let xMax = spec.xMax ?? Math.max(...xs);
    if (xMin === xMax) { xMin -= 30; xMax += 30; }
    const values = all.map((p) => p[1]).concat(threshold ? [threshold.value] : []);
    const yMin = spec.yMin ?? Math.min(0, ...values);
    const yMax = spec.yMax ?? Math.max(...values);
    const root = frame(width, height, label);
    const y = yAxis(root, { width, height, yMin, yMax, yFormat });
    const x = xAxis(root, { width, height, xMin, xMax, xFormat, ticks: 6 });
    if (threshold) {
      root.append(svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y(threshold.value), y2: y(threshold.value), class: "threshold" }),
        svg("text", { x: width - PAD.right, y: y(threshold.value) - 5, "text-anchor": "end", class: "threshold-label", text: threshold.label }));
    }
    for (const s of series) {
      const points = s.points.filter((p) => p[1] !== null && p[1] !== undefined);
      if (!points.length) continue;
      const d = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
      root.append(svg("path", { d, class: `line ${s.className}` }));
      if (points.length <= 40) {
        // A dashed series' dots are smaller, so an equal point of the series under it still rings them.
        for (const p of points) root.append(svg("circle", { cx: x(p[0]), cy: y(p[1]), r: s.dashed ? 1.6 : 2.6, class: `dot ${s.className}` },
          svg("title", { text: `${s.name} ${yFormat(p[1])} at ${xFormat(p[0])}` })));
      }
    }
    replace(plot, root);
  });
}

// Success, degraded and failed stacked per time slot (rows with those counts, or null).
export function outcomeStacks(slots) {
  return ["success", "degraded", "failed"].map((key) => ({
    name: key[0].toUpperCase() + key.slice(1), className: `s-${key}`, values: slots.map(([, row]) => (row ? row[key] : 0)),
  }));
}

// Stacked columns, one per x. stacks: [{name, className, values: [...]}], x: [...]
export function columnChart(container, spec) {
  const { label, x: xs, stacks, yFormat = String, xFormat = String, height = 200, empty = "No data yet." } = spec;
  const totals = xs.map((_, i) => stacks.reduce((sum, s) => sum + (s.values[i] || 0), 0));
  if (!xs.length || !totals.some((t) => t > 0)) return emptyState(container, empty);
  const plot = h("div", { class: "chart-plot" });
  replace(container, plot, legend(stacks),
    dataTable(label, ["time", ...stacks.map((s) => s.name), "total"],
      xs.map((value, i) => [xFormat(value), ...stacks.map((s) => yFormat(s.values[i] || 0)), yFormat(totals[i])])));
  mount(plot, () => {
    const width = Math.max(280, plot.clientWidth);
    const yMax = Math.max(...totals);
    const root = frame(width, height, label);
    const y = yAxis(root, { width, height, yMin: 0, yMax, yFormat });
    const inner = width - PAD.left - PAD.right;
    const slot = inner / xs.length;
    const barWidth = Math.max(2, Math.min(28, slot * 0.7));
    const labelEvery = Math.ceil(xs.length / Math.max(2, Math.floor(inner / 70)));
    xs.forEach((value, i) => {
      const cx = PAD.left + slot * (i + 0.5);
      let base = 0;
      for (const s of stacks) {
        const v = s.values[i] || 0;
        if (!v) continue;
        root.append(svg("rect", { x: cx - barWidth / 2, width: barWidth, y: y(base + v), height: Math.max(1, y(base) - y(base + v)), class: `bar ${s.className}` },
          svg("title", { text: `${s.name}: ${yFormat(v)} at ${xFormat(value)}` })));
        base += v;
      }
      if (i % labelEvery === 0) root.append(svg("text", { x: cx, y: height - 8, class: "tick", "text-anchor": "middle", text: xFormat(value) }));
    });
    replace(plot, root);
  });
}

// Heartbeats as ticks along the bottom, coloured by the state the instance was in, under a line
// of the load each beat reported.
export function beatTimeline(container, { label, beats, from, to, height = 120 }) {
  if (!beats.length) return emptyState(container, "No heartbeat seen yet.");
  const plot = h("div", { class: "chart-plot" });
  replace(container, plot, legend([{ name: "Load", className: "s-raw", dashed: true }, { name: "Heartbeat (healthy)", className: "s-success" },
    { name: "Heartbeat (demoted)", className: "s-degraded" }]));
  const time = (v) => new Date(v * 1000).toLocaleTimeString("en-GB", { hour12: false });
  mount(plot, () => {
    const width = Math.max(280, plot.clientWidth);
    const root = frame(width, height, label);
    const x = xAxis(root, { width, height, xMin: from, xMax: to, xFormat: time, ticks: 5 });
    const y = yAxis(root, { width, height: height - 22, yMin: 0, yMax: 1, parts: 2, yFormat: (v) => `${Math.round(v * 100)} %` });
    const shown = beats.filter((beat) => beat.at >= from);
    const loads = shown.filter((beat) => beat.load !== null && beat.load !== undefined);
    if (loads.length) root.append(svg("path", { class: "line s-raw", d: loads.map((b, i) => `${i ? "L" : "M"}${x(b.at).toFixed(1)},${y(b.load).toFixed(1)}`).join("") }));
    const band = height - PAD.bottom;
    for (const beat of shown) {
      root.append(svg("line", { x1: x(beat.at), x2: x(beat.at), y1: band - 12, y2: band, class: `beat beat-${beat.state}` },
        svg("title", { text: `${time(beat.at)} · ${beat.state} · load ${beat.load ?? "—"}` })));
    }
    replace(plot, root);
  });
}

// Reach-rate alerts, active and recently resolved, and the thresholds that raise them.

import { call } from "../lib/api.js";
import { h, replace, card, table, field, clearFieldErrors, showRefusal } from "../lib/dom.js";
import { refreshOnTick } from "../lib/refresh.js";
import * as fmt from "../lib/format.js";
import { qualityAlertTable } from "../lib/quality.js";

const SETTINGS = [
  ["reach_threshold", "Reach threshold", "A fraction: 0.98 alerts below 98 %."],
  ["consecutive_periods", "Consecutive periods", "How many periods in a row must be below the threshold."],
  ["min_failures", "Minimum failures", "Failures those periods must add up to before anyone is woken."],
];

function alertTable(rows, resolved) {
  return table([
    { label: "Capability", rowHeader: true, cell: (a) => h("a", { href: `#/traces?capability=${encodeURIComponent(a.capability)}`, text: a.capability }) },
    { label: "Reach rate", numeric: true, cell: (a) => h("span", { class: resolved ? "" : "bad-text", text: fmt.percent(a.reach_rate, 2) }) },
    { label: "Threshold", numeric: true, cell: (a) => fmt.percent(a.threshold, 2) },
    { label: "Failed / calls", numeric: true, cell: (a) => `${fmt.count(a.failures)} / ${fmt.count(a.total)}` },
    { label: "Periods", numeric: true, cell: (a) => a.periods },
    { label: "Fired", cell: (a) => fmt.dateTime(a.fired_at) },
    ...(resolved ? [{ label: "Resolved", cell: (a) => fmt.dateTime(a.resolved_at) }] : []),
  ], rows, { caption: resolved ? "Recently resolved alerts" : "Active alerts", empty: resolved ? "Nothing resolved recently." : "No active alert: every capability is reaching its callers." });
}

function settingsForm(current) {
  const status = h("div", { class: "form-status", role: "status", "aria-live": "polite" });
  const summary = h("div", { class: "error-summary", role: "alert", hidden: true });
  const form = h("form", { class: "settings-form", novalidate: true, "aria-labelledby": "thresholds-title" },
    summary,
    h("div", { class: "field-grid" }, SETTINGS.map(([name, label, hint]) =>
      field(label, h("input", { type: "text", inputmode: "decimal", value: current[name] ?? "", autocomplete: "off" }), { name, hint }))),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn btn-primary", text: "Save thresholds" }), status));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearFieldErrors(form);
    summary.hidden = true;
    const body = {};
    for (const [name] of SETTINGS) {
      const raw = form.elements.namedItem(name).value.trim();
      body[name] = raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw;
    }
    const answer = await call("/api/settings/alerts", { method: "PUT", body });
    if (answer.ok) {
      status.textContent = "Saved. Routers apply the new thresholds within a second.";
      return;
    }
    showRefusal(form, summary, answer);
  });
  return form;
}

export async function render(main, { live }) {
  const active = h("div", { "aria-live": "polite" });
  const resolved = h("div");
  const quality = h("div", { "aria-live": "polite" });
  const inForce = h("p", { class: "card-note" });
  const settings = h("div");
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Alerts" }),
      h("p", { class: "page-sub", text: "A capability alerts when its reach rate stays below the threshold for consecutive periods with enough failures." })),
    card("Active", { id: "active" }, active),
    card("Below quality floor", { id: "quality-alerts", note: "Live instances whose posted quality score is under their capability's policy quality_floor: out of rotation until restored." }, quality),
    h("div", { class: "grid-2 wide-left" },
      card("Recently resolved", { id: "resolved" }, resolved),
      h("section", { class: "card", "aria-labelledby": "thresholds-title" },
        h("div", { class: "card-head" }, h("h2", { id: "thresholds-title", text: "Thresholds" }), inForce), settings)));

  const stored = await call("/api/settings/alerts");
  if (stored.ok) replace(settings, settingsForm(stored.body));
  else replace(settings, h("p", { class: "notice bad", role: "alert", text: `Cannot read the thresholds: ${stored.body?.message || stored.status}` }));

  async function refreshQuality() {
    const answer = await call("/api/quality");
    replace(quality, answer.ok ? qualityAlertTable(answer.body.alerts)
      : h("p", { class: "notice bad", role: "alert", text: `The registry gave no quality alerts: ${answer.body?.message || answer.status}` }));
  }

  let lastKey = "";
  async function refresh() {
    await refreshQuality();
    const answer = await call("/api/alerts");
    if (!answer.ok) {
      replace(active, h("p", { class: "notice bad", role: "alert", text: `The router gave no alerts: ${answer.body?.message || answer.status}` }));
      return;
    }
    const key = JSON.stringify(answer.body);
    if (key === lastKey) return;
    lastKey = key;
    const { alerts, config } = answer.body;
    replace(active, alertTable(alerts.filter((a) => a.state === "active"), false));
    replace(resolved, alertTable(alerts.filter((a) => a.state === "resolved"), true));
    inForce.textContent = `In force on the router: below ${fmt.percent(config.reach_threshold, 2)} for ${config.consecutive_periods} periods with at least ${config.min_failures} failures.`;
  }
  await refresh();
  return refreshOnTick(live, refresh, 2);
}

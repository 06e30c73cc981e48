// Quality scores per instance: an operator's (or a golden-set job's) verdict, 0 to 1, on one agent's
// capability. Below the capability's policy quality floor the instance leaves rotation (it is not evicted)
// and the registry alerts until the score or the floor says otherwise.

import { call } from "./api.js";
import { h, replace, card, table, field, clearFieldErrors, showRefusal } from "./dom.js";
import * as fmt from "./format.js";

function qualityPath(...parts) {
  return ["/api/quality", ...parts.map(encodeURIComponent)].join("/");
}

function standing(view) {
  if (view.below_floor) return h("span", { class: "badge badge-alert", text: "below floor" });
  return view.floor === null ? h("span", { class: "muted", text: "no floor" }) : "in rotation";
}

function scoreTable(views) {
  return table([
    { label: "Capability", rowHeader: true, cell: (v) => h("code", { text: v.capability }) },
    { label: "Score", numeric: true, cell: (v) => (v.score === null ? fmt.DASH : v.score.toFixed(2)) },
    { label: "Floor", numeric: true, cell: (v) => (v.floor === null ? fmt.DASH : v.floor.toFixed(2)) },
    { label: "Source", cell: (v) => v.source || fmt.DASH },
    { label: "Posted", cell: (v) => (v.posted_at ? fmt.dateTime(v.posted_at) : fmt.DASH) },
    { label: "Standing", cell: (v) => (v.score === null ? fmt.DASH : standing(v)) },
  ], views, { caption: "Quality per capability", empty: "This instance offers no capability.", rowKey: (v) => v.capability });
}

// The scores the registry holds for ``agentId``, one row per capability it offers (unscored ones too).
async function scoresOf(agentId, capabilities) {
  const answers = await Promise.all(capabilities.map((name) => call(qualityPath(name))));
  const failed = answers.find((answer) => !answer.ok);
  if (failed) return { error: failed.body?.message || `HTTP ${failed.status}` };
  return { views: capabilities.map((name, i) => answers[i].body.find((v) => v.agent_id === agentId)
    || { capability: name, score: null, floor: null, source: null, posted_at: null, below_floor: false }) };
}

function editor(agentId, capabilities, done) {
  const summary = h("div", { class: "error-summary", role: "alert", hidden: true });
  const form = h("form", { class: "settings-form", novalidate: true, "aria-label": "Edit this instance's scores" }, summary,
    h("div", { class: "field-grid" },
      field("Capability", h("select", {}, capabilities.map((name) => h("option", { value: name, text: name }))), { name: "capability" }),
      field("Quality score", h("input", { type: "text", inputmode: "decimal", autocomplete: "off" }), { name: "score", hint: "From 0 (useless) to 1 (perfect)." }),
      field("Source", h("input", { type: "text", autocomplete: "off" }), { name: "source", hint: "Optional: where the score comes from, e.g. golden-set-2026-12." })),
    h("div", { class: "form-actions" },
      h("button", { type: "submit", class: "btn btn-primary", text: "Save score" }),
      h("button", { type: "button", class: "btn btn-quiet", text: "Delete score", onclick: () => send("DELETE") })));
  const value = (name) => form.elements.namedItem(name).value.trim();
  async function send(method) {
    clearFieldErrors(form);
    summary.hidden = true;
    const raw = value("score");
    const body = method === "PUT" ? { score: raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw, source: value("source") || null } : undefined;
    const answer = await call(qualityPath(value("capability"), agentId), { method, body });
    if (!answer.ok) {
      showRefusal(form, summary, answer);
      return;
    }
    await done(method === "PUT" ? `Saved: ${answer.body.score} for ${answer.body.capability}.` : `Deleted the score for ${answer.body.capability}.`);
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send("PUT");
  });
  return form;
}

// A card showing and editing ``agentId``'s quality for each of ``capabilities``; it loads itself.
export function qualityCard(agentId, capabilities) {
  const list = h("div", { "aria-live": "polite" });
  const status = h("p", { class: "form-status", role: "status", "aria-live": "polite" });
  async function refresh(message) {
    if (message !== undefined) status.textContent = message;
    const { views, error } = await scoresOf(agentId, capabilities);
    replace(list, error ? h("p", { class: "notice bad", role: "alert", text: `The registry gave no quality scores: ${error}` }) : scoreTable(views));
  }
  refresh();
  return card("Quality", { id: "quality", note: "Posted by operators or a scheduled job; below its policy's quality floor an instance leaves rotation." },
    list, capabilities.length ? editor(agentId, capabilities, refresh) : null, status);
}

// The registry's quality alerts: live instances scored below their capability's floor.
export function qualityAlertTable(alerts) {
  return table([
    { label: "Capability", rowHeader: true, cell: (a) => h("code", { text: a.capability }) },
    { label: "Instance", cell: (a) => h("a", { href: `#/agents/${encodeURIComponent(a.agent_id)}`, text: a.agent_id }) },
    { label: "Score", numeric: true, cell: (a) => h("span", { class: "bad-text", text: a.score.toFixed(2) }) },
    { label: "Floor", numeric: true, cell: (a) => a.floor.toFixed(2) },
    { label: "Source", cell: (a) => a.source || fmt.DASH },
    { label: "Posted", cell: (a) => fmt.dateTime(a.posted_at) },
  ], alerts, { caption: "Instances below their quality floor", empty: "Every scored instance meets its capability's quality floor." });
}

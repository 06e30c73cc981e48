// Learned examples: phrasings callers confirmed (or operators wrote) for a capability. Only accepted
// ones route; the registry checks each at acceptance and stores it rejected, with the reason, when it
// would send a labelled phrasing to a wrong capability. Reviewed here: accept, reject, delete, add.

import { call, get } from "../lib/api.js";
import { h, replace, card, table, field, fieldValue, badge, clearFieldErrors, showRefusal } from "../lib/dom.js";

function examplesPath(capability, ...rest) {
  return ["/api/examples", capability, ...rest].map((part, i) => (i ? encodeURIComponent(part) : part)).join("/");
}

function queue(summary, capabilities) {
  const counted = new Map(summary.map((s) => [s.capability, s]));
  const rows = [...new Set([...capabilities, ...counted.keys()])].sort()
    .map((name) => counted.get(name) || { capability: name, pending: 0, accepted: 0, rejected: 0, auto_accept_at: null });
  return table([
    { label: "Capability", rowHeader: true, cell: (s) => h("a", { href: `#/examples/${encodeURIComponent(s.capability)}`, text: s.capability }) },
    { label: "Pending", numeric: true, cell: (s) => h("span", { class: s.pending ? "tone-warn" : "", text: String(s.pending) }) },
    { label: "Accepted", numeric: true, cell: (s) => String(s.accepted) },
    { label: "Rejected", numeric: true, cell: (s) => String(s.rejected) },
    { label: "Auto-accept at", numeric: true, cell: (s) => (s.auto_accept_at ? `${s.auto_accept_at} callers` : "off") },
  ], rows, { caption: "Examples by capability", empty: "No capability is offered yet." });
}

function actions(capability, example, done) {
  const act = async (label, method, suffix) => {
    const answer = await call(examplesPath(capability, example.id, ...suffix), { method });
    done(answer.ok ? `${label}: “${example.text}”` : `Not done: ${answer.body?.message || answer.status}`);
  };
  return h("span", { class: "row-actions" },
    example.state !== "accepted" ? h("button", { type: "button", class: "btn", text: "Accept", onclick: () => act("Accepted", "POST", ["accept"]) }) : null,
    example.state !== "rejected" ? h("button", { type: "button", class: "btn", text: "Reject", onclick: () => act("Rejected", "POST", ["reject"]) }) : null,
    h("button", { type: "button", class: "btn btn-quiet", text: "Delete", onclick: () => act("Deleted", "DELETE", []) }));
}

function exampleTable(capability, examples, done) {
  return table([
    { label: "Phrasing", rowHeader: true, cell: (e) => e.text },
    { label: "State", cell: (e) => badge(e.state) },
    { label: "Confirmations", numeric: true, cell: (e) => String(e.confirmations) },
    { label: "Source", cell: (e) => e.source },
    { label: "Reason", cell: (e) => e.reason || "" },
    { label: "Review", cell: (e) => actions(capability, e, done) },
  ], examples, { caption: `Examples of ${capability}`, empty: "No example yet: callers confirm intents, or add one below.", rowKey: (e) => e.id });
}

function form({ label, name, button, hint, value = "", clear = false, submit }) {
  const summary = h("div", { class: "error-summary", role: "alert", hidden: true });
  const element = h("form", { class: "settings-form", novalidate: true }, summary,
    field(label, h("input", { type: "text", value, autocomplete: "off" }), { name, hint }),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn btn-primary", text: button })));
  element.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearFieldErrors(element);
    summary.hidden = true;
    const answer = await submit(element.elements.namedItem(name).value);
    if (!answer.ok) showRefusal(element, summary, answer);
    else if (clear) element.reset();
  });
  return element;
}

async function renderCapability(main, capability) {
  const status = h("p", { class: "form-status", role: "status", "aria-live": "polite" });
  const list = h("div", { id: "examples-table" });
  const settingsHolder = h("div");
  async function refresh(message) {
    if (message !== undefined) status.textContent = message;
    const answer = await call(examplesPath(capability));
    replace(list, answer.ok ? exampleTable(capability, answer.body, refresh)
      : h("p", { class: "notice bad", role: "alert", text: `The registry gave no examples: ${answer.body?.message || answer.status}` }));
  }
  const add = form({ label: "New example", name: "text", button: "Add example", clear: true,
    hint: "Accepted at once, unless it would route something wrongly.",
    submit: async (text) => {
      const answer = await call(examplesPath(capability), { method: "POST", body: { text } });
      if (answer.ok) await refresh(answer.body.state === "accepted" ? `Added: “${answer.body.text}”` : `Rejected: ${answer.body.reason}`);
      return answer;
    } });
  const settings = await get(examplesPath(capability, "settings"));
  replace(settingsHolder, form({ label: "Auto-accept at (distinct callers)", name: "auto_accept_at", button: "Save", value: settings.auto_accept_at ?? "",
    hint: "Empty: an operator accepts every example.",
    submit: async (raw) => {
      const value = fieldValue(raw);
      const answer = await call(examplesPath(capability, "settings"), { method: "PUT", body: { auto_accept_at: value } });
      if (answer.ok) status.textContent = value ? `Auto-accepted once ${value} distinct callers confirm.` : "Auto-accept off.";
      return answer;
    } }));
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: `Examples of ${capability}` }),
      h("p", { class: "page-sub" }, h("a", { href: "#/examples", text: "All capabilities" }))),
    status,
    card("Examples", { id: "examples" }, list),
    h("div", { class: "grid-2" }, card("Add by hand", { id: "add-example" }, add), card("Settings", { id: "example-settings" }, settingsHolder)));
  await refresh();
}

export async function render(main, { params }) {
  if (params.id) {
    await renderCapability(main, params.id);
    return;
  }
  const [summary, policies] = await Promise.all([call("/api/examples"), call("/api/policies")]);
  const capabilities = policies.ok ? policies.body.policies.map((p) => p.capability) : [];
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Learned examples" }),
      h("p", { class: "page-sub", text: "Phrasings confirmed by callers after a refusal, waiting for review; accepted ones route on every router." })),
    card("Review queue", { id: "queue" }, summary.ok ? queue(summary.body, capabilities)
      : h("p", { class: "notice bad", role: "alert", text: `The registry gave no examples: ${summary.body?.message || summary.status}` })));
}

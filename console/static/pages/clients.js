// The clients the registry knows: their trust, grants and rate limit, and each budget with what was spent of it
// this period and when it resets (the registry's account; routers report their spend every 10 s). A budget is
// set or cleared here; clients are made and otherwise changed with `agentreach clients`.

import { call } from "../lib/api.js";
import { h, replace, card, table, field, fieldValue, clearFieldErrors, showRefusal } from "../lib/dom.js";
import { keepFocus } from "../lib/live-table.js";
import { refreshOnTick } from "../lib/refresh.js";
import * as fmt from "../lib/format.js";

// Each limited dimension of a budget: [what it is called, the limit, spent, committed, how it reads].
function dimensions(client, account) {
  return [
    ["tokens", client.budget_tokens, account?.spent_tokens, account?.committed_tokens, fmt.count],
    ["cost", client.budget_cost, account?.spent_cost, account?.committed_cost, fmt.cost],
  ].filter(([, limit]) => limit !== null && limit !== undefined);
}

function budget(client) {
  if (!client.budget_period) return "none";
  return `${dimensions(client).map(([name, limit, , , show]) => `${show(limit)} ${name}`).join(" and ")} per ${client.budget_period}`;
}

function spent(client) {
  if (!client.budget_period) return fmt.DASH;
  if (!client.account) return h("span", { class: "bad-text", text: "unreadable" });
  const parts = dimensions(client, client.account);
  const text = parts.map(([name, limit, used, , show]) => `${show(used)} ${name} (${fmt.percent(used / limit, 0)})`).join(", ");
  const dry = parts.some(([, limit, , committed]) => committed >= limit);
  return dry ? h("span", { class: "bad-text", text: `${text}, none left` }) : text;
}

const COLUMNS = [
  { label: "Client", rowHeader: true, cell: (c) => h("span", {}, c.name, " ", h("code", { text: c.client_id })) },
  { label: "Trust", cell: (c) => c.trust_level },
  { label: "Grants", cell: (c) => h("span", { class: "caps" }, c.grants.map((g) => h("code", { text: g }))) },
  { label: "Rate limit", numeric: true, cell: (c) => (c.rate_limit_qps ? `${fmt.rate(c.rate_limit_qps)} calls/s` : "none") },
  { label: "State", cell: (c) => (c.enabled ? "enabled" : h("span", { class: "bad-text", text: "disabled" })) },
  { label: "Budget", cell: budget },
  { label: "Spent this period", cell: spent },
  { label: "Resets", cell: (c) => (c.account ? fmt.dateTime(c.account.reset_at) : fmt.DASH) },
];

const LIMITS = ["budget_tokens", "budget_cost"];

// Setting or clearing a client's budget (the registry's PUT /clients/{id}/budget, relayed): the whole budget is
// replaced, a refusal shows next to the field it names. ``saved`` reloads the table.
function budgetEditor(saved) {
  const summary = h("div", { class: "error-summary", role: "alert", hidden: true });
  const status = h("p", { class: "form-status", role: "status", "aria-live": "polite" });
  const chooser = h("select", { onchange: () => fill() });
  const form = h("form", { class: "settings-form", novalidate: true, "aria-labelledby": "budget-editor-title" }, summary,
    h("div", { class: "field-grid" },
      field("Client", chooser, { name: "client_id" }),
      field("Tokens per period", h("input", { type: "text", inputmode: "numeric", autocomplete: "off" }), { name: "budget_tokens", hint: "Input plus output tokens; empty: no token limit." }),
      field("Cost per period", h("input", { type: "text", inputmode: "decimal", autocomplete: "off" }), { name: "budget_cost", hint: "At the instances' prices; empty: no cost limit." }),
      field("Period", h("select", {}, h("option", { value: "", text: "none" }), ["hour", "day", "month"].map((p) => h("option", { value: p, text: p }))),
        { name: "budget_period", hint: "Calendar hours, days or months in UTC." })),
    h("div", { class: "form-actions" },
      h("button", { type: "submit", class: "btn btn-primary", text: "Save budget" }),
      h("button", { type: "button", class: "btn btn-quiet", text: "Remove budget", onclick: () => send({}) }),
      status));
  const control = (name) => form.elements.namedItem(name);
  let clients = new Map();
  let listed = "";
  function fill() {
    const client = clients.get(chooser.value);
    for (const name of [...LIMITS, "budget_period"]) control(name).value = client?.[name] ?? "";
  }
  async function send(body) {
    clearFieldErrors(form);
    summary.hidden = true;
    status.textContent = "";
    const answer = await call(`/api/clients/${encodeURIComponent(chooser.value)}/budget`, { method: "PUT", body });
    if (!answer.ok) {
      showRefusal(form, summary, answer);
      return;
    }
    await saved();
    fill();
    status.textContent = answer.body.budget_period ? `Saved: ${budget(answer.body)} for ${answer.body.name}.` : `Removed ${answer.body.name}'s budget.`;
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send({ ...Object.fromEntries(LIMITS.map((name) => [name, fieldValue(control(name).value)])), budget_period: control("budget_period").value || null });
  });
  // The clients to choose from; the options are rebuilt only when clients come or go (an open list stays open).
  function update(list) {
    clients = new Map(list.map((c) => [c.client_id, c]));
    const names = JSON.stringify(list.map((c) => [c.client_id, c.name]));
    form.hidden = list.length === 0;
    if (names === listed) return;
    listed = names;
    const chosen = chooser.value;
    replace(chooser, list.map((c) => h("option", { value: c.client_id, text: `${c.name} (${c.client_id})` })));
    if (clients.has(chosen)) chooser.value = chosen;
    else fill();
  }
  return { form, update };
}

export async function render(main, { live }) {
  const summary = h("p", { class: "page-sub", "aria-live": "polite" });
  const holder = h("div", { id: "clients-table" });
  const editor = budgetEditor(() => refresh());
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Clients" }), summary),
    h("section", { class: "card", "aria-label": "Clients" }, holder),
    card("Set a budget", { id: "budget-editor", note: "Replaces the client's whole budget; its spend this period is kept. Routers apply it at once." }, editor.form));

  let lastKey = "";
  async function refresh() {
    const answer = await call("/api/clients");
    if (!answer.ok) {
      lastKey = "";
      replace(holder, h("p", { class: "notice bad", role: "alert", text: `The registry gave no clients: ${answer.body?.message || answer.status}` }));
      return;
    }
    const key = JSON.stringify(answer.body);
    if (key === lastKey) return;
    lastKey = key;
    const clients = answer.body.clients.sort((a, b) => a.name.localeCompare(b.name) || a.client_id.localeCompare(b.client_id));
    summary.textContent = `${clients.length} clients, ${clients.filter((c) => c.budget_period).length} with a budget. Made with agentreach clients; a budget is set below.`;
    editor.update(clients);
    keepFocus(holder, () => replace(holder, table(COLUMNS, clients, {
      caption: "Clients", rowKey: (c) => c.client_id, empty: "No client yet: agentreach clients create makes one.",
    })));
  }
  await refresh();
  // Routers report spend every 10 s: every fifth tick is often enough, and asks the registry for fewer accounts.
  return refreshOnTick(live, refresh, 5);
}

// The clients the registry knows: their trust, grants and rate limit, and each budget with what was spent of it
// this period and when it resets (the registry's account; routers report their spend every 10 s). Read-only:
// clients are made and changed with `agentreach clients`.

import { call } from "../lib/api.js";
import { h, replace, table } from "../lib/dom.js";
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

export async function render(main, { live }) {
  const summary = h("p", { class: "page-sub", "aria-live": "polite" });
  const holder = h("div", { id: "clients-table" });
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Clients" }), summary),
    h("section", { class: "card", "aria-label": "Clients" }, holder));

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
    summary.textContent = `${clients.length} clients, ${clients.filter((c) => c.budget_period).length} with a budget. Made and changed with agentreach clients.`;
    keepFocus(holder, () => replace(holder, table(COLUMNS, clients, {
      caption: "Clients", rowKey: (c) => c.client_id, empty: "No client yet: agentreach clients create makes one.",
    })));
  }
  await refresh();
  // Routers report spend every 10 s: every fifth tick is often enough, and asks the registry for fewer accounts.
  return refreshOnTick(live, refresh, 5);
}

// Recent calls through the router, newest first; each opens as a trace.

import { call } from "../lib/api.js";
import { h, replace, card, table, badge, field } from "../lib/dom.js";
import { keepFocus } from "../lib/live-table.js";
import { refreshOnTick } from "../lib/refresh.js";
import * as fmt from "../lib/format.js";

export function traceLink(requestId, text = requestId) {
  return h("a", { href: `#/traces/${encodeURIComponent(requestId)}`, class: "mono", text });
}

const COLUMNS = [
  { label: "Started", cell: (t) => fmt.clock(t.started_at, true) },
  { label: "Request", rowHeader: true, cell: (t) => traceLink(t.request_id, t.request_id.slice(0, 12)) },
  { label: "Capability", cell: (t) => h("code", { text: t.capability }) },
  { label: "Outcome", cell: (t) => badge(t.outcome) },
  { label: "Policy", cell: (t) => t.policy ?? fmt.DASH },
  { label: "Instance", cell: (t) => (t.attempts.length ? t.attempts[t.attempts.length - 1].instance : fmt.DASH) },
  { label: "Attempts", numeric: true, cell: (t) => t.attempts.length },
  { label: "Total", numeric: true, cell: (t) => fmt.ms(t.total_ms) },
  { label: "Overhead", numeric: true, cell: (t) => fmt.ms(t.overhead_ms) },
  { label: "Error", cell: (t) => t.error_code ?? fmt.DASH },
];

export async function render(main, { live, query }) {
  const capability = h("input", { type: "search", value: query.get("capability") || "", placeholder: "every capability" });
  const requestId = h("input", { type: "text", placeholder: "request_id", autocomplete: "off", spellcheck: "false" });
  const holder = h("div");
  const status = h("p", { class: "page-sub", "aria-live": "polite" });
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Traces" }), status),
    h("div", { class: "filters" },
      h("form", { class: "inline-form", "aria-label": "Open a trace", onsubmit: (e) => {
        e.preventDefault();
        if (requestId.value.trim()) location.hash = `#/traces/${encodeURIComponent(requestId.value.trim())}`;
      } }, field("Request ID", requestId, { name: "request_id" }), h("button", { type: "submit", class: "btn", text: "Open trace" })),
      h("form", { class: "inline-form", role: "search", "aria-label": "Filter traces", onsubmit: (e) => { e.preventDefault(); refresh(); } },
        field("Capability", capability, { name: "capability" }), h("button", { type: "submit", class: "btn btn-quiet", text: "Filter" }))),
    card("Recent calls", { id: "recent", note: "Newest first, as the router keeps them in memory." }, holder));

  async function refresh() {
    const params = new URLSearchParams({ limit: "100" });
    if (capability.value.trim()) params.set("capability", capability.value.trim());
    const answer = await call(`/api/traces?${params}`);
    if (!answer.ok) {
      status.textContent = "";
      replace(holder, h("p", { class: "notice bad", role: "alert", text: `The router gave no traces: ${answer.body?.message || answer.status}` }));
      return;
    }
    const traces = answer.body.traces;
    status.textContent = `${traces.length} recent call${traces.length === 1 ? "" : "s"}`;
    keepFocus(holder, () => replace(holder, table(COLUMNS, traces, { caption: "Recent calls", empty: "No call has gone through the router yet." })));
  }
  await refresh();
  return refreshOnTick(live, refresh, 2);
}

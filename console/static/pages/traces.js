// Recent calls through the router, newest first, a page at a time; each opens as a trace.

import { call } from "../lib/api.js";
import { h, replace, card, table, badge, field } from "../lib/dom.js";
import { keepFocus } from "../lib/live-table.js";
import { refreshOnTick } from "../lib/refresh.js";
import * as fmt from "../lib/format.js";

export function traceLink(requestId, text = requestId) {
  return h("a", { href: `#/traces/${encodeURIComponent(requestId)}`, class: "mono", text });
}

const PAGE = 25;

const COLUMNS = [
  { label: "Started", cell: (t) => fmt.clock(t.started_at, true) },
  { label: "Request", rowHeader: true, cell: (t) => traceLink(t.request_id) },
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
  let offset = 0;
  const newer = h("button", { type: "button", class: "btn btn-quiet", text: "← Newer", onclick: () => turn(-PAGE) });
  const older = h("button", { type: "button", class: "btn btn-quiet", text: "Older →", onclick: () => turn(PAGE) });
  const shown = h("span", { class: "muted", "aria-live": "polite" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages of recent calls" }, newer, shown, older);
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Traces" }), status),
    h("div", { class: "filters" },
      h("form", { class: "inline-form", "aria-label": "Open a trace", onsubmit: (e) => {
        e.preventDefault();
        if (requestId.value.trim()) location.hash = `#/traces/${encodeURIComponent(requestId.value.trim())}`;
      } }, field("Request ID", requestId, { name: "request_id" }), h("button", { type: "submit", class: "btn", text: "Open trace" })),
      h("form", { class: "inline-form", role: "search", "aria-label": "Filter traces", onsubmit: (e) => { e.preventDefault(); offset = 0; refresh(); } },
        field("Capability", capability, { name: "capability" }), h("button", { type: "submit", class: "btn btn-quiet", text: "Filter" }))),
    card("Recent calls", { id: "recent", note: "Newest first, as the router keeps them in memory." }, holder, pager));

  function turn(by) {
    offset = Math.max(0, offset + by);
    refresh();
  }

  async function refresh() {
    const params = new URLSearchParams({ limit: String(PAGE), offset: String(offset) });
    if (capability.value.trim()) params.set("capability", capability.value.trim());
    const answer = await call(`/api/traces?${params}`);
    if (!answer.ok) {
      status.textContent = "";
      replace(holder, h("p", { class: "notice bad", role: "alert", text: `The router gave no traces: ${answer.body?.message || answer.status}` }));
      return;
    }
    const { traces, more } = answer.body;
    status.textContent = traces.length || offset ? "" : "No recent call";
    shown.textContent = traces.length ? `Calls ${offset + 1}–${offset + traces.length}` : "";
    newer.disabled = offset === 0;
    older.disabled = !more;
    keepFocus(holder, () => replace(holder, table(COLUMNS, traces, { caption: "Recent calls", empty: "No call has gone through the router yet." })));
  }
  await refresh();
  return refreshOnTick(live, refresh, 2);
}

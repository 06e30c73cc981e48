// The trace view: one request_id end to end — entry, routing decision, attempts, the answer and
// the timings — with nested calls (same trace_id, parent_request_id) as a tree.

import { call } from "../lib/api.js";
import { h, replace, card, badge, url } from "../lib/dom.js";
import * as fmt from "../lib/format.js";
import { scoreFacts } from "../lib/scores.js";
import { intentFacts } from "../lib/intents.js";

function walk(node, depth = 0, out = []) {
  out.push({ call: node.call, depth });
  for (const child of node.children) walk(child, depth + 1, out);
  return out;
}

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.map(([k, v]) => h("div", {}, h("dt", { text: k }), h("dd", {}, v ?? fmt.DASH))));
}

// A client by its name, with the id the router recorded (names are the registry's, looked up now).
function caller(id, names) {
  if (!id) return null;
  return names[id] ? h("span", {}, names[id], " ", h("code", { class: "muted", text: id })) : h("code", { text: id });
}

function callDetails(c, names) {
  const agentMs = c.attempts.reduce((sum, a) => sum + a.elapsed_ms, 0);
  return h("div", { class: "stages" },
    h("section", { class: "stage", "aria-label": "Entry" }, h("h3", { text: "Entry" }), facts([
      ["Started", fmt.dateTime(c.started_at)], ["Caller", caller(c.caller, names)], ["Payload", `${fmt.count(c.payload_bytes)} bytes`],
      ["Timeout hint", c.timeout_hint ? fmt.ms(c.timeout_hint) : null],
      ["Routing hint", c.routing_hint ? h("code", { text: JSON.stringify(c.routing_hint) }) : null],
      ["Trace", h("code", { text: c.trace_id })], ["Parent", c.parent_request_id ? h("a", { href: `#/traces/${encodeURIComponent(c.parent_request_id)}`, class: "mono", text: c.parent_request_id }) : null],
    ])),
    h("section", { class: "stage", "aria-label": "Decision" }, h("h3", { text: "Decision" }), facts([
      ...intentFacts(c), ["Policy", c.policy], ...scoreFacts(c), ["Plan", c.plan.length ? h("ol", { class: "plan" }, c.plan.map((id) => h("li", {}, h("a", { href: `#/agents/${encodeURIComponent(id)}`, text: id })))) : null],
      ["Degraded", c.degraded ? "yes" : "no"], ["Reason", c.reason],
    ])),
    h("section", { class: "stage", "aria-label": "Answer" }, h("h3", { text: "Answer" }), facts([
      ["Outcome", badge(c.outcome)], ["Error", c.error_code], ["Total", fmt.ms(c.total_ms)],
      ["Router overhead", fmt.ms(c.overhead_ms)], ["In agents", fmt.ms(agentMs)],
      ["Tokens", c.usage ? `${fmt.count(c.usage.input_tokens)} in, ${fmt.count(c.usage.output_tokens)} out` : null],
      ["Cost", c.usage ? fmt.cost(c.usage.cost) : null],
    ])));
}

// Every call and attempt as a bar on one time axis, starting at the root call.
function waterfall(rows) {
  const origin = Math.min(...rows.map((r) => r.call.started_at));
  const offset = (c) => (c.started_at - origin) * 1000;
  const span = Math.max(1, ...rows.map((r) => offset(r.call) + r.call.total_ms));
  const bar = (start, width, className, label) => h("span", { class: "wf-track" },
    h("span", { class: `wf-bar ${className}`, style: { left: `${(100 * start) / span}%`, width: `${Math.max(0.4, (100 * width) / span)}%` }, title: label }));
  const items = [];
  for (const { call: c, depth } of rows) {
    items.push(h("li", { class: "wf-row wf-call", style: { "--depth": depth } },
      h("span", { class: "wf-name" }, h("a", { href: `#/traces/${encodeURIComponent(c.request_id)}`, class: "mono", title: c.request_id, text: c.request_id.slice(0, 12) }), " ", h("code", { text: c.capability })),
      bar(offset(c), c.total_ms, `outcome-${c.outcome}`, `${c.capability}: ${fmt.ms(c.total_ms)}`),
      h("span", { class: "wf-time num", text: `${fmt.ms(offset(c))} + ${fmt.ms(c.total_ms)}` })));
    c.attempts.forEach((a, i) => {
      items.push(h("li", { class: "wf-row wf-attempt", style: { "--depth": depth + 1 } },
        h("span", { class: "wf-name" }, `attempt ${i + 1} → `, h("a", { href: `#/agents/${encodeURIComponent(a.instance)}`, text: a.instance }),
          a.error_code ? h("span", { class: "bad-text", text: ` ${a.error_code}` }) : null),
        bar(offset(c) + a.started_ms, a.elapsed_ms, a.error_code ? "attempt-failed" : "attempt-ok", `${a.instance}: ${fmt.ms(a.elapsed_ms)}`),
        h("span", { class: "wf-time num", text: `${fmt.ms(offset(c) + a.started_ms)} + ${fmt.ms(a.elapsed_ms)}` })));
    });
  }
  return h("ol", { class: "waterfall", "aria-label": "Timings: each call and attempt, start offset plus duration" }, items);
}

function attemptsTable(c) {
  if (!c.attempts.length) return h("p", { class: "muted", text: "No attempt: the router answered without reaching an agent." });
  return h("div", { class: "table-wrap" }, h("table", {},
    h("caption", { class: "visually-hidden", text: `Attempts of ${c.request_id}` }),
    h("thead", {}, h("tr", {}, ["#", "Instance", "Protocol", "Endpoint", "Started at", "Took", "Error", "Message"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, c.attempts.map((a, i) => h("tr", {},
      h("td", { text: i + 1 }), h("td", {}, h("a", { href: `#/agents/${encodeURIComponent(a.instance)}`, text: a.instance })),
      h("td", { text: a.protocol }), h("td", {}, url(a.endpoint)),
      h("td", { class: "num", text: `+${fmt.ms(a.started_ms)}` }), h("td", { class: "num", text: fmt.ms(a.elapsed_ms) }),
      h("td", { class: a.error_code ? "bad-text" : "", text: a.error_code ?? "—" }), h("td", { text: a.message || "" }))))));
}

export async function render(main, { params }) {
  const id = params.id;
  replace(main, h("div", { class: "page-head" },
    h("p", { class: "crumbs" }, h("a", { href: "#/traces", text: "Traces" }), " / "),
    h("h1", {}, "Trace ", h("code", { class: "mono", text: id }))));
  const answer = await call(`/api/traces/${encodeURIComponent(id)}`);
  if (!answer.ok) {
    const message = answer.status === 404 ? "The router has no trace with this request_id (it keeps recent calls only)." : answer.body?.message;
    main.append(h("p", { class: "notice bad", role: "alert", text: message || `HTTP ${answer.status}` }));
    return;
  }
  const { call: c, tree, caller_names: names = {} } = answer.body;
  const rows = walk(tree);
  main.append(
    card("This call", { id: "call" }, callDetails(c, names)),
    card("Attempts", { id: "attempts" }, attemptsTable(c)),
    card(rows.length > 1 ? `Call tree (${rows.length} calls)` : "Timings", { id: "tree", note: "Offsets from the start of the root call; nested calls share the trace_id." }, waterfall(rows)));
}

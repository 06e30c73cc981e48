// The debug entry: build or paste an ATP request frame, send it through the router, and read
// the response frame, how it was routed, how long each part took, and its trace.

import { call } from "../lib/api.js";
import { h, replace, card, field, setFieldError, clearFieldErrors, badge } from "../lib/dom.js";
import * as fmt from "../lib/format.js";
import { scoreFacts } from "../lib/scores.js";
import { intentFacts } from "../lib/intents.js";

function parseJson(text, fallback) {
  return text.trim() === "" ? fallback : JSON.parse(text);
}

function buildFrame(form) {
  const frame = { capability: form.elements.namedItem("capability").value.trim() };
  const problems = [];
  for (const [name, fallback] of [["payload", null], ["context", {}]]) {
    try {
      frame[name] = parseJson(form.elements.namedItem(name).value, fallback);
    } catch (error) {
      problems.push([name, `Not valid JSON: ${error.message}`]);
    }
  }
  const hint = form.elements.namedItem("timeout_hint").value.trim();
  if (hint) frame.timeout_hint = Number.isFinite(Number(hint)) ? Number(hint) : hint;
  const requestId = form.elements.namedItem("request_id").value.trim();
  if (requestId) frame.request_id = requestId;
  return { frame, problems };
}

// [label, value] rows, each findable by its label ("Router overhead" → data-fact="router-overhead").
function factList(id, rows) {
  return h("dl", { class: "facts", id }, rows.map(([k, v]) => h("div", { dataset: { fact: k.toLowerCase().replace(/ /g, "-") } },
    h("dt", { text: k }), h("dd", {}, v ?? fmt.DASH))));
}

function routeFacts(route) {
  return factList("route-facts", [["Capability", route.capability], ...intentFacts(route), ["Instance", route.instance], ["Policy", route.policy],
    ...scoreFacts(route), ["Attempts", route.attempts], ["Degraded", route.degraded ? "yes" : "no"], ["Reason", route.reason],
    ["SLA", route.timeout_sla_ms ? fmt.ms(route.timeout_sla_ms) : null]]);
}

// Time outside the router, but only for a call that reached an agent: a refused or unroutable
// call never left the router, so there is no agent or network time to speak of.
function agentTime(r, route) {
  if (route.attempts) return route.overhead_ms === undefined || route.overhead_ms === null ? null : fmt.ms(Math.max(0, r.elapsed_ms - route.overhead_ms));
  return [401, 403, 429].includes(r.http_status) ? "not reached: refused by the router" : "not reached: answered by the router";
}

function result(answer) {
  const r = answer.body;
  const frame = r.frame || {};
  const route = (frame && frame.route) || {};
  const ok = r.http_status === 200;
  return h("div", { class: "debug-result", id: "debug-result" },
    h("p", { class: "result-line" },
      badge(ok ? "success" : "failed"), " ",
      h("strong", { text: `HTTP ${r.http_status}` }), " ",
      ok ? (route.degraded ? "delivered, degraded" : "delivered") : `${frame.error_code || "error"}: ${frame.error_message || ""}`, " ",
      r.request_id ? h("a", { href: `#/traces/${encodeURIComponent(r.request_id)}`, class: "btn btn-quiet", id: "open-trace", text: "Open its trace" }) : null),
    h("div", { class: "grid-2" },
      h("section", { "aria-labelledby": "route-title" }, h("h3", { id: "route-title", text: "Route" }), routeFacts(route)),
      h("section", { "aria-labelledby": "timing-title" }, h("h3", { id: "timing-title", text: "Timings" }),
        factList("timing-facts", [["Round trip", fmt.ms(r.elapsed_ms)], ["Router overhead", fmt.ms(route.overhead_ms ?? null)],
          ["Agent and network", agentTime(r, route)], ["Request ID", h("code", { class: "mono", text: r.request_id || fmt.DASH })]]))),
    h("h3", { text: "Response frame" }),
    h("pre", { class: "code", id: "response-frame", tabindex: "0", "aria-label": "Response frame", text: typeof frame === "string" ? frame : fmt.json(frame) }),
    h("details", { class: "chart-data" }, h("summary", { text: "Response headers" }),
      h("pre", { class: "code", text: Object.entries(r.headers).map(([k, v]) => `${k}: ${v}`).join("\n") })));
}

export async function render(main, { query, config }) {
  const names = await call("/api/policies");
  const capabilities = names.ok ? names.body.policies.map((p) => p.capability) : [];
  const capability = h("input", { type: "text", value: query.get("capability") || capabilities[0] || "", list: "debug-capabilities", autocomplete: "off" });
  const payload = h("textarea", { rows: 5, class: "mono", spellcheck: "false", text: '{"text": "hello"}' });
  const context = h("textarea", { rows: 3, class: "mono", spellcheck: "false", text: '{"session_id": "console-debug"}' });
  const timeoutHint = h("input", { type: "text", inputmode: "numeric", autocomplete: "off" });
  const requestId = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
  const frameText = h("textarea", { rows: 12, class: "mono", spellcheck: "false", id: "frame-text" });
  const output = h("div", { "aria-live": "polite" }, h("p", { class: "muted", text: "Send a frame to see the router's answer here." }));

  const builder = h("form", { class: "builder", novalidate: true, "aria-label": "Build a request frame" },
    h("datalist", { id: "debug-capabilities" }, capabilities.map((n) => h("option", { value: n }))),
    field("Capability", capability, { name: "capability" }),
    field("Payload (JSON)", payload, { name: "payload" }),
    field("Context (JSON)", context, { name: "context", hint: "session_id, routing_hint, trace_id…" }),
    h("div", { class: "field-grid" },
      field("Timeout hint, ms", timeoutHint, { name: "timeout_hint" }),
      field("Request ID", requestId, { name: "request_id", hint: "Empty: the router makes one." })),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn", text: "Build frame ↓" })));

  function build() {
    clearFieldErrors(builder);
    const { frame, problems } = buildFrame(builder);
    for (const [name, message] of problems) setFieldError(builder, name, message);
    if (!problems.length) frameText.value = fmt.json(frame);
    return !problems.length;
  }
  builder.addEventListener("submit", (event) => { event.preventDefault(); build(); });

  // With auth on the router checks a caller's grants and trust level, so the call is made as a client:
  // the console's own debug client for the capability, or one whose API key the operator pastes.
  const callerKey = config.auth === "on" ? h("input", { type: "password", autocomplete: "off", spellcheck: "false", id: "caller-key", disabled: true }) : null;
  const callAs = (value, text, checked) => h("label", { class: "choice" },
    h("input", { type: "radio", name: "call_as", value, checked, onchange: () => { callerKey.disabled = value !== "key"; } }), text);
  const caller = callerKey ? h("fieldset", { class: "call-as" }, h("legend", { text: "Call as" }),
    callAs("debug-client", "The console's debug client (internal trust, granted this capability only)", true),
    callAs("key", "A client, by its API key", false),
    field("Caller API key", callerKey, { name: "caller_key", hint: "A client's API key (agentreach clients create): the call is checked like any caller's." })) : null;
  const sender = h("form", { class: "sender", "aria-label": "Send a request frame" },
    field("ATP request frame", frameText, { name: "frame", hint: "Edit it, or paste any frame: it is sent to the router exactly as written." }),
    caller,
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn btn-primary", id: "send-frame", text: "Send through the router" })));
  sender.addEventListener("submit", async (event) => {
    event.preventDefault();
    replace(output, h("p", { class: "muted", text: "Sending…" }));
    const asDebugClient = callerKey !== null && callerKey.disabled;
    const key = callerKey && !asDebugClient ? callerKey.value.trim() : "";
    const answer = await call(asDebugClient ? "/api/debug?as=debug-client" : "/api/debug",
      { method: "POST", raw: frameText.value, headers: key ? { "X-Reach-Caller-Key": key } : {} });
    replace(output, answer.ok ? result(answer) : h("p", { class: "notice bad", role: "alert", text: answer.body?.message || `HTTP ${answer.status}` }));
  });

  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Debug entry" }),
      h("p", { class: "page-sub", text: "Fire one call at a capability by hand: is it the agent or the mesh?" })),
    h("div", { class: "grid-2" },
      card("Build a frame", { id: "build" }, builder),
      card("Frame", { id: "frame" }, sender)),
    card("Answer", { id: "answer" }, output));
  build();
}

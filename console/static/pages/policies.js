// Routing policies: each capability's policy, affinity, timeouts, retry, circuit breaker and
// fallback, edited here and saved through the registry; the registry's validation errors are
// shown next to the field they name. Rules, version splits, mirroring and degradation are edited as
// JSON, and the rule table is shown with the calls each rule decided (or, in shadow, agreed with).

import { call, get } from "../lib/api.js";
import { h, replace, card, table, field, clearFieldErrors, setFieldError, showRefusal } from "../lib/dom.js";
import * as fmt from "../lib/format.js";

// [path, label, kind, hint]
const FIELDS = [
  ["Selection", [
    ["policy", "Policy", "policy", "Empty: the instances' preference, else the router's default."],
    ["fallback_capability", "Fallback capability", "text", "Called when every instance of this capability fails."],
  ]],
  ["Affinity (sticky sessions)", [
    ["affinity.enabled", "Sticky sessions on", "bool"],
    ["affinity.key", "Context key", "text"],
    ["affinity.ttl_seconds", "Stickiness, seconds", "number"],
  ]],
  ["Timeouts", [
    ["timeout.connect_ms", "Connect, ms", "number"],
    ["timeout.first_byte_ms", "First byte, ms", "number", "Empty: from the capability's SLA."],
    ["timeout.total_ms", "Total, ms", "number", "Empty: the capability's timeout_sla_ms."],
  ]],
  ["Retry", [
    ["retry.enabled", "Retry idempotent calls", "bool"],
    ["retry.max_attempts", "Max attempts", "number"],
  ]],
  ["Circuit breaker", [
    ["circuit_breaker.error_threshold_percent", "Error threshold, %", "number"],
    ["circuit_breaker.min_requests", "Minimum requests", "number"],
    ["circuit_breaker.window_seconds", "Window, seconds", "number"],
    ["circuit_breaker.reset_seconds", "Open for, seconds", "number"],
    ["circuit_breaker.half_open_probes", "Half-open probes", "number"],
  ]],
];

// Edited as one JSON object: the registry names the member at fault (e.g. "rules[1].priority").
const RELEASE_KEYS = ["rules", "split", "rollback", "mirror", "degradation"];

function read(policy, path) {
  return path.split(".").reduce((value, key) => (value == null ? undefined : value[key]), policy);
}

function write(target, path, value) {
  const keys = path.split(".");
  const last = keys.pop();
  let node = target;
  for (const key of keys) node = node[key] ??= {};
  node[last] = value;
}

function input(path, kind, value) {
  if (kind === "bool") return h("input", { type: "checkbox", checked: Boolean(value) });
  if (kind === "policy") {
    return h("select", {}, [["", "router default"], ["least_load", "least_load"], ["hash", "hash"], ["affinity", "affinity"], ["scored", "scored"]]
      .map(([v, label]) => h("option", { value: v, text: label, selected: (value ?? "") === v })));
  }
  const attrs = { type: "text", value: value ?? "", autocomplete: "off" };
  if (kind === "number") attrs.inputmode = "decimal";
  if (path === "fallback_capability") attrs.list = "known-capabilities";
  return h("input", attrs);
}

// The form's values over the stored policy (so members the form does not show are kept), as a policy
// body; a number field that does not parse is sent as written so the registry, the one place that
// validates, names it. Throws SyntaxError when the releases JSON does not parse.
function collect(form, stored) {
  const body = structuredClone(stored);
  Object.assign(body, JSON.parse(form.elements.namedItem("releases").value || "{}"));
  for (const [, fields] of FIELDS) {
    for (const [path, , kind] of fields) {
      const el = form.elements.namedItem(path);
      let value;
      if (kind === "bool") value = el.checked;
      else if (el.value.trim() === "") value = null;
      else if (kind === "number") value = Number.isFinite(Number(el.value)) ? Number(el.value) : el.value;
      else value = el.value.trim();
      if (value === null && !["policy", "fallback_capability", "timeout.first_byte_ms", "timeout.total_ms"].includes(path)) continue;
      write(body, path, value);
    }
  }
  return body;
}

// Saved only over the policy the editor opened (or last saved): its ETag goes along as If-Match (none stored:
// If-None-Match: *, create only), and a policy changed or created meanwhile (a canary rollback, another operator)
// is refused, offered to reload, never overwritten.
function editor(entry, names, onSaved, onReload) {
  let base = entry.policy;
  let etag = entry.etag;
  const status = h("div", { class: "form-status", role: "status", "aria-live": "polite" });
  const summary = h("div", { class: "error-summary", role: "alert", hidden: true });
  const preview = h("pre", { class: "code", tabindex: "0", "aria-label": "Policy as stored", text: fmt.json(entry.policy) });
  const form = h("form", { class: "policy-form", novalidate: true, "aria-labelledby": "editor-title" },
    summary,
    FIELDS.map(([legend, fields]) => h("fieldset", {}, h("legend", { text: legend }),
      h("div", { class: "field-grid" }, fields.map(([path, label, kind, hint]) => {
        const control = input(path, kind, read(entry.policy, path));
        const wrapped = field(label, control, { name: path, hint });
        if (kind === "bool") wrapped.classList.add("field-check");
        return wrapped;
      })))),
    h("fieldset", {}, h("legend", { text: "Rules, versions and releases (JSON)" }),
      field("Rules, split, rollback, mirror, degradation", h("textarea", {
        class: "code", rows: 12, spellcheck: "false",
        text: fmt.json(Object.fromEntries(RELEASE_KEYS.filter((key) => key in entry.policy).map((key) => [key, entry.policy[key]]))),
      }), { name: "releases", hint: "docs/atp.md, Rules, versions, canaries, mirroring and degradation." })),
    h("datalist", { id: "known-capabilities" }, names.filter((n) => n !== entry.capability).map((n) => h("option", { value: n }))),
    h("div", { class: "form-actions" },
      h("button", { type: "submit", class: "btn btn-primary", text: "Save policy" }),
      h("button", { type: "button", class: "btn btn-quiet", text: "Reset to default", disabled: !entry.stored, onclick: reset }),
      status));

  async function save(event) {
    event.preventDefault();
    clearFieldErrors(form);
    summary.hidden = true;
    status.textContent = "Saving…";
    let body;
    try {
      body = collect(form, base);
    } catch (error) {
      status.textContent = "";
      setFieldError(form, "releases", `Not JSON: ${error.message}`);
      form.elements.namedItem("releases").focus();
      return;
    }
    const headers = etag ? { "If-Match": etag } : { "If-None-Match": "*" };
    const answer = await call(`/api/policies/${encodeURIComponent(entry.capability)}`, { method: "PUT", body, headers });
    if (answer.ok) {
      status.textContent = "Saved in the registry. Routers apply it within a second.";
      base = answer.body;
      etag = answer.headers.get("ETag");
      preview.textContent = fmt.json(answer.body);
      onSaved(entry.capability);
      return;
    }
    status.textContent = "";
    if (answer.status === 409 && ["policy_changed", "policy_exists"].includes(answer.body?.error)) {
      summary.hidden = false;
      replace(summary, h("strong", { text: "Not saved. " }), "The policy was changed since you opened it — reload to see it, then make your change again. ",
        h("button", { type: "button", class: "btn btn-quiet", text: "Reload", onclick: onReload }));
      summary.querySelector("button").focus();
      return;
    }
    showRefusal(form, summary, answer);
    const named = answer.body?.field;
    if (named && RELEASE_KEYS.some((key) => named === key || named.startsWith(`${key}[`) || named.startsWith(`${key}.`))) {
      setFieldError(form, "releases", `${named}: ${answer.body.message}`);
      form.elements.namedItem("releases").focus();
    }
  }

  async function reset() {
    const answer = await call(`/api/policies/${encodeURIComponent(entry.capability)}`, { method: "DELETE" });
    status.textContent = answer.ok ? "Reset: the capability follows the default policy." : answer.body?.message || `HTTP ${answer.status}`;
    if (!answer.ok) return;
    etag = null;  // nothing stored: the next save creates one
    onSaved(entry.capability);
  }

  form.addEventListener("submit", save);
  return h("div", { class: "editor" }, form, h("details", { class: "chart-data" }, h("summary", { text: "Stored JSON" }), preview));
}

// The rule table in priority order with what the router counted: calls each live rule decided, and
// each shadow rule's agreement with the live decisions.
async function rulesCard(entry) {
  const rules = [...(entry.policy.rules || [])].sort((a, b) => a.priority - b.priority);
  const answer = await call(`/api/rules/stats?capability=${encodeURIComponent(entry.capability)}`);
  const stats = answer.ok ? answer.body : { hits: [], shadow: [] };
  const hits = Object.fromEntries(stats.hits.map((row) => [row.rule, row.calls]));
  const shadow = Object.fromEntries(stats.shadow.map((row) => [row.rule, row]));
  const conditions = (rule) => [
    ...Object.entries(rule.match?.context || {}).map(([key, value]) => `context.${key} = ${JSON.stringify(value)}`),
    rule.match?.client ? `client = ${rule.match.client}` : null, rule.match?.trust_level ? `trust level = ${rule.match.trust_level}` : null,
    rule.match?.budget_used_above != null ? `budget used > ${fmt.percent(rule.match.budget_used_above)}` : null,
  ].filter(Boolean).join(", ") || "every call";
  const target = (rule) => Object.entries(rule.target || {}).filter(([, v]) => v != null).map(([k, v]) => `${k} ${v}`).join(", ") || fmt.DASH;
  return card("Rules", { id: "rules", note: answer.ok ? "Counted by the router since it started." : "The router did not answer: no counts." },
    table([
      { label: "Priority", numeric: true, cell: (r) => String(r.priority) },
      { label: "Rule", rowHeader: true, cell: (r) => h("code", { text: r.id }) },
      { label: "Mode", cell: (r) => r.mode },
      { label: "When", cell: conditions },
      { label: "Action", cell: (r) => `${r.action}${r.action === "refuse" ? "" : ` → ${target(r)}`}` },
      { label: "Calls decided", numeric: true, cell: (r) => (r.mode === "live" ? String(hits[r.id] ?? 0) : fmt.DASH) },
      { label: "Shadow agree / disagree", numeric: true, cell: (r) => (r.mode === "shadow" ? `${shadow[r.id]?.agree ?? 0} / ${shadow[r.id]?.disagree ?? 0}` : fmt.DASH) },
    ], rules, { caption: `Rules of ${entry.capability}`, empty: "No rules: the policy alone routes.", rowKey: (r) => r.id }));
}

export async function render(main, { params }) {
  const listHolder = h("div");
  const editorHolder = h("div");
  const selected = params.id ? decodeURIComponent(params.id) : null;
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: "Policies" }),
      h("p", { class: "page-sub", text: "How the router picks an instance for each capability. Saved in the registry's log; live within a second." })),
    h("div", { class: "grid-2 wide-right" },
      card("Capabilities", { id: "capabilities" }, listHolder),
      h("section", { class: "card", "aria-labelledby": "editor-title" }, editorHolder)));

  async function load(afterSave) {
    const { policies } = await get("/api/policies");
    replace(listHolder, table([
      { label: "Capability", rowHeader: true, cell: (p) => h("a", { href: `#/policies/${encodeURIComponent(p.capability)}`, "aria-current": p.capability === selected ? "true" : undefined, text: p.capability }) },
      { label: "Service", cell: (p) => p.service ?? fmt.DASH },
      { label: "Policy", cell: (p) => (p.stored ? p.policy.policy ?? "router default" : h("span", { class: "muted", text: "default" })) },
      { label: "Fallback", cell: (p) => p.policy.fallback_capability ?? fmt.DASH },
    ], policies, { caption: "Capabilities and their policies", empty: "No capability is registered yet." }));
    if (afterSave) return;
    const entry = policies.find((p) => p.capability === selected);
    if (!selected) {
      replace(editorHolder, h("h2", { id: "editor-title", text: "Edit a policy" }), h("p", { class: "muted", text: "Choose a capability to see and edit its policy." }));
    } else if (!entry) {
      replace(editorHolder, h("h2", { id: "editor-title", text: selected }), h("p", { class: "notice bad", text: "No such capability is registered." }));
    } else {
      replace(editorHolder, h("div", { class: "card-head" }, h("h2", { id: "editor-title" }, "Policy of ", h("code", { text: entry.capability })),
        h("p", { class: "card-note", text: entry.stored ? "Stored in the registry." : "No policy stored: showing the defaults." })),
      editor(entry, policies.map((p) => p.capability), () => load(true), () => load(false)), await rulesCard(entry));
    }
  }
  await load(false);
}

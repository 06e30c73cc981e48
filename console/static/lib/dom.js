// Building DOM from data without innerHTML: every value lands as text, never as markup.
// Styles are set through the CSSOM ({ style: { width: "40%", "--depth": 2 } }): the console's
// Content-Security-Policy refuses style attributes (console/headers.py).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "style") for (const [property, setting] of Object.entries(value)) el.style.setProperty(property, setting);
    else el.setAttribute(name, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (name === "text") el.textContent = value;
    else el.setAttribute(name, value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// A page section: a titled card, optionally with a note under the title.
export function card(title, { id, note, actions } = {}, ...body) {
  const headingId = id ? `${id}-title` : undefined;
  return h("section", { class: "card", id, "aria-labelledby": headingId },
    h("div", { class: "card-head" },
      h("h2", { id: headingId, text: title }),
      note ? h("p", { class: "card-note", text: note }) : null,
      actions || null),
    ...body);
}

export function table(columns, rows, { caption, empty = "Nothing yet.", rowKey } = {}) {
  const head = h("thead", {}, h("tr", {}, columns.map((c) =>
    h("th", { scope: "col", class: c.numeric ? "num" : undefined, text: c.label }))));
  const body = h("tbody", {}, rows.length ? rows.map((row) => h("tr", { dataset: rowKey ? { key: rowKey(row) } : undefined },
    columns.map((c, i) => {
      const value = c.cell(row);
      const attrs = { class: c.numeric ? "num" : undefined };
      return i === 0 && c.rowHeader ? h("th", { scope: "row", ...attrs }, value) : h("td", attrs, value);
    }))) : h("tr", {}, h("td", { colspan: columns.length, class: "empty", text: empty })));
  return h("div", { class: "table-wrap" },
    h("table", {}, caption ? h("caption", { class: "visually-hidden", text: caption }) : null, head, body));
}

// A URL that wraps only between its parts (after / ? & = # and hyphens), never inside a word.
export function url(text) {
  return h("code", { class: "url" }, String(text).split(/(?<=[/?&=#-])/).flatMap((part, i) => (i ? [h("wbr"), part] : [part])));
}

export function badge(state) {
  return h("span", { class: `badge badge-${state}`, text: state });
}

// A labelled form field whose error text (if any) sits under it and is announced.
export function field(label, input, { hint, name } = {}) {
  const id = input.id || `f-${(name || label).replace(/[^a-z0-9]+/gi, "-").toLowerCase()}`;
  input.id = id;
  const errorId = `${id}-error`;
  const hintId = hint ? `${id}-hint` : null;
  input.setAttribute("aria-describedby", [hintId, errorId].filter(Boolean).join(" "));
  if (name) input.name = name;
  const wrap = h("div", { class: "field", dataset: { field: name || "" } },
    h("label", { for: id, text: label }),
    input,
    hint ? h("p", { class: "hint", id: hintId, text: hint }) : null,
    h("p", { class: "field-error", id: errorId, role: "alert" }));
  return wrap;
}

export function setFieldError(form, name, message) {
  for (const wrap of form.querySelectorAll(".field")) {
    const mine = wrap.dataset.field === name;
    const input = wrap.querySelector("input, select, textarea");
    const error = wrap.querySelector(".field-error");
    if (mine && message) {
      error.textContent = message;
      input.setAttribute("aria-invalid", "true");
    } else if (!message || mine) {
      error.textContent = "";
      input.removeAttribute("aria-invalid");
    }
  }
}

export function clearFieldErrors(form) {
  for (const wrap of form.querySelectorAll(".field")) {
    wrap.querySelector(".field-error").textContent = "";
    wrap.querySelector("input, select, textarea").removeAttribute("aria-invalid");
  }
}

// A typed field's value as the API reads it: empty is null, a number a number, anything else as typed
// (the server's refusal then names the field, rather than the console guessing what was meant).
export function fieldValue(raw) {
  const text = raw.trim();
  return text === "" ? null : Number.isFinite(Number(text)) ? Number(text) : text;
}

// A save the registry refused: say so at the top of the form, and next to the field it names
// (then move focus there, so a keyboard user lands on what to fix).
export function showRefusal(form, summary, answer) {
  const { message, field: name } = answer.body || {};
  summary.hidden = false;
  replace(summary, h("strong", { text: "Not saved. " }), name ? `${name}: ` : "", message || `HTTP ${answer.status}`);
  const control = name && form.elements.namedItem(name);
  if (control) {
    setFieldError(form, name, message);
    control.focus();
  }
}

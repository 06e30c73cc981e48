// Signing in with the admin key. The console answers with an HttpOnly cookie (a session id, never
// the key), so nothing here keeps the key: it lives in the form field until the request is sent.

import { call } from "./api.js";
import { h, replace, field, setFieldError } from "./dom.js";

export function renderSignIn(main) {
  const input = h("input", { type: "password", autocomplete: "current-password", spellcheck: "false", required: true });
  const form = h("form", { class: "signin-form", novalidate: true, "aria-labelledby": "signin-title" },
    field("Admin key", input, { name: "admin_key", hint: "Printed once by the registry's first start; stored in DATA_DIR/admin.key." }),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn btn-primary", id: "sign-in", text: "Sign in" })));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      setFieldError(form, "admin_key", "Enter the admin key.");
      input.focus();
      return;
    }
    const answer = await call("/api/session", { method: "POST", body: { admin_key: key } });
    if (answer.ok) {
      location.reload();
      return;
    }
    setFieldError(form, "admin_key", answer.body?.message || `Sign-in failed (HTTP ${answer.status}).`);
    input.select();
    input.focus();
  });
  replace(main,
    h("section", { class: "card signin", "aria-labelledby": "signin-title" },
      h("h1", { id: "signin-title", text: "Sign in" }),
      h("p", { class: "page-sub", text: "This console changes routing policies and alert thresholds, so it asks for the mesh's admin key." }),
      form));
  document.title = "Sign in · Agent Reach console";
  input.focus();
}

export async function signOut() {
  await call("/api/session", { method: "DELETE" });
  location.reload();
}

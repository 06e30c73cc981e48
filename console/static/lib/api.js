// Talking to the console's JSON API, and the live feed of server-sent events.

export async function call(path, { method = "GET", body, raw, headers = {} } = {}) {
  const options = { method, headers: { ...headers } };
  if (raw !== undefined) {
    options.body = raw;
    options.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    options.body = JSON.stringify(body);
    options.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (error) {
    return { status: 0, ok: false, body: { error: "console_unreachable", message: String(error), field: null } };
  }
  if (response.status === 401 && response.headers.get("X-Console-Sign-In") === "required") {
    // Signed out meanwhile (the session ran out or the console restarted): back to the sign-in form.
    window.dispatchEvent(new CustomEvent("console:signed-out"));
  }
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = { error: "not_json", message: text.slice(0, 300), field: null };
  }
  return { status: response.status, ok: response.ok, body: parsed, headers: response.headers };
}

export async function get(path) {
  const answer = await call(path);
  if (!answer.ok) {
    const message = answer.body?.message || `HTTP ${answer.status}`;
    throw Object.assign(new Error(message), { answer });
  }
  return answer.body;
}

// One EventSource for the whole app; pages subscribe to topics and get the latest value at once.
export class LiveFeed {
  constructor(url) {
    this.handlers = new Map();
    this.latest = new Map();
    this.onstatus = () => {};
    this.source = new EventSource(url);
    this.source.onopen = () => this.onstatus(true);
    this.source.onerror = () => this.onstatus(false);
    for (const topic of ["overview", "agents"]) {
      this.source.addEventListener(topic, (event) => {
        const data = JSON.parse(event.data);
        this.latest.set(topic, data);
        for (const handler of this.handlers.get(topic) || []) handler(data);
      });
    }
  }

  on(topic, handler) {
    if (!this.handlers.has(topic)) this.handlers.set(topic, new Set());
    this.handlers.get(topic).add(handler);
    if (this.latest.has(topic)) handler(this.latest.get(topic));
    return () => this.handlers.get(topic).delete(handler);
  }
}

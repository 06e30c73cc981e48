// The console shell: configuration, the live feed, the connection indicators and hash routing.
// Each page module exports render(main, context) and may return a function that cleans it up.

import { get, LiveFeed } from "./lib/api.js";
import { replace, h } from "./lib/dom.js";
import { renderSignIn, signOut } from "./lib/signin.js";

const pages = [
  [/^\/?$/, "overview", () => import("./pages/overview.js")],
  [/^\/agents$/, "agents", () => import("./pages/agents.js")],
  [/^\/agents\/(?<id>[^/]+)$/, "agents", () => import("./pages/agent.js")],
  [/^\/reach$/, "reach", () => import("./pages/reach.js")],
  [/^\/routes$/, "routes", () => import("./pages/routes.js")],
  [/^\/traces$/, "traces", () => import("./pages/traces.js")],
  [/^\/traces\/(?<id>[^/]+)$/, "traces", () => import("./pages/trace.js")],
  [/^\/policies$/, "policies", () => import("./pages/policies.js")],
  [/^\/policies\/(?<id>[^/]+)$/, "policies", () => import("./pages/policies.js")],
  [/^\/alerts$/, "alerts", () => import("./pages/alerts.js")],
  [/^\/clients$/, "clients", () => import("./pages/clients.js")],
  [/^\/examples$/, "examples", () => import("./pages/examples.js")],
  [/^\/examples\/(?<id>[^/]+)$/, "examples", () => import("./pages/examples.js")],
  [/^\/debug$/, "debug", () => import("./pages/debug.js")],
];

const main = document.getElementById("main");
let cleanup = null;
let firstRoute = true;

function showUpstream(id, name, status) {
  const item = document.getElementById(id);
  item.dataset.ok = status.ok ? "yes" : "no";
  item.querySelector(".upstream-text").textContent = status.ok ? `${name}: connected` : `${name}: unreachable`;
  item.title = status.ok ? "" : status.error || "";
}

function showAlertCount(active) {
  const badge = document.getElementById("alert-count");
  badge.hidden = !active;
  badge.textContent = active ? String(active) : "";
  badge.setAttribute("aria-label", `${active} active`);
}

async function route(context) {
  const [rawPath, rawQuery = ""] = location.hash.replace(/^#/, "").split("?");
  const path = decodeURIComponent(rawPath) || "/";
  const query = new URLSearchParams(rawQuery);
  const match = pages.map(([pattern, section, load]) => [path.match(pattern), section, load]).find(([m]) => m);
  if (cleanup) { cleanup(); cleanup = null; }
  for (const link of document.querySelectorAll(".sidenav a")) {
    const current = match && link.dataset.section === match[1];
    if (current) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  if (!match) {
    replace(main, h("h1", { tabindex: "-1", text: "Not found" }), h("p", {}, "No console page at ", h("code", { text: path }), "."));
    return;
  }
  const [found, , load] = match;
  const module = await load();
  replace(main);
  cleanup = (await module.render(main, { ...context, params: found.groups || {}, query })) || null;
  const heading = main.querySelector("h1");
  document.title = heading ? `${heading.textContent} · Agent Reach console` : "Agent Reach console";
  if (!firstRoute && heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus();
  }
  firstRoute = false;
}

async function start() {
  const session = await get("/api/session");
  document.getElementById("auth-banner").hidden = session.auth !== "off";
  if (!session.signed_in) {
    document.body.dataset.signedOut = "";
    renderSignIn(main);
    return;
  }
  const signOutButton = document.getElementById("sign-out");
  signOutButton.hidden = session.auth === "off";
  signOutButton.addEventListener("click", signOut);
  window.addEventListener("console:signed-out", () => location.reload(), { once: true });
  const config = await get("/api/config");
  const live = new LiveFeed("/api/stream?topics=overview,agents");
  live.onstatus = (ok) => showUpstream("up-live", "Live feed", { ok, error: ok ? "" : "reconnecting" });
  live.on("overview", (overview) => {
    showUpstream("up-registry", "Registry", overview.registry);
    showUpstream("up-router", "Router", overview.router);
    showAlertCount(overview.active_alerts + overview.quality_alerts);
  });
  const context = { config, live };
  window.addEventListener("hashchange", () => route(context));
  await route(context);
}

start();

// The scored policy explained: each instance's score (0 best, 1 worst) and its parts, each 0 to 1 against
// fixed bounds, with the router's own measurements behind them (GET /scores/{capability} on the router).

import { call } from "./api.js";
import { h, replace, card, table, field } from "./dom.js";
import * as fmt from "./format.js";

export function scoreParts(parts) {
  return parts ? Object.entries(parts).map(([name, value]) => `${name} ${value.toFixed(2)}`).join(" · ") : null;
}

// [label, value] rows of a scored call (its route or its trace): the score, an exploration, the parts; none unscored.
export function scoreFacts(scored) {
  return scored.score === undefined || scored.score === null ? [] : [
    ["Score", `${scored.score.toFixed(3)}${scored.explored ? " (exploring)" : ""}`], ["Score parts", scoreParts(scored.score_parts)]];
}

const quality = (s) => (s.quality === null ? fmt.DASH : s.below_quality_floor
  ? h("span", { class: "badge badge-alert", text: `${s.quality.toFixed(2)} below floor` }) : s.quality.toFixed(2));

// A router run as --workers N lists each worker's own scores of an instance, labelled with the worker.
const scorer = (s) => (s.worker === undefined ? s.agent_id : `${s.agent_id} (worker ${s.worker})`);

function instanceTable(answer) {
  return table([
    { label: "Instance", rowHeader: true, cell: (s) => h("a", { href: `#/agents/${encodeURIComponent(s.agent_id)}`, text: scorer(s) }) },
    { label: "State", cell: (s) => s.state },
    { label: "Score", numeric: true, cell: (s) => s.score.toFixed(3) },
    { label: "Parts", cell: (s) => scoreParts(s.parts) },
    { label: "Latency (EWMA)", numeric: true, cell: (s) => fmt.ms(s.latency_ms) },
    { label: "Error rate", numeric: true, cell: (s) => `${fmt.percent(s.error_rate, 1)} of ${fmt.count(s.samples)}` },
    { label: "In flight", numeric: true, cell: (s) => fmt.count(s.inflight) },
    { label: "Load", numeric: true, cell: (s) => fmt.load(s.load) },
    { label: "Cost", numeric: true, cell: (s) => fmt.cost(s.cost) },
    { label: "Quality", numeric: true, cell: quality },
  ], answer.instances, { caption: `Instance scores of ${answer.capability}`, empty: "No instance offers it now.", rowKey: scorer });
}

function settingsLine(answer) {
  const weights = Object.entries(answer.weights).filter(([, w]) => w !== null).map(([name, w]) => `${name} ${w}`).join(", ");
  return `Policy ${answer.policy}; weights ${weights}; explore share ${fmt.percent(answer.explore_share, 0)}; quality floor ${answer.quality_floor ?? "none"}.`;
}

// A card listing every instance's score for the capability picked; ``refresh`` re-reads the router.
export function scoresCard(capabilities) {
  const picker = h("select", {}, capabilities.map((name) => h("option", { value: name, text: name })));
  const line = h("p", { class: "muted" });
  const list = h("div", { "aria-live": "polite" });
  async function refresh() {
    if (!picker.value) {
      replace(list, h("p", { class: "muted", text: "No capability is offered yet." }));
      return;
    }
    const answer = await call(`/api/scores/${encodeURIComponent(picker.value)}`);
    if (!answer.ok) {
      line.textContent = "";
      replace(list, h("p", { class: "notice bad", role: "alert", text: `The router gave no scores: ${answer.body?.message || answer.status}` }));
      return;
    }
    line.textContent = settingsLine(answer.body);
    replace(list, instanceTable(answer.body));
  }
  picker.addEventListener("change", refresh);
  const element = card("Instance scores", { id: "scores", note: "As the scored policy sees each instance now, on this router (each router learns from its own calls)." },
    field("Capability", picker, { name: "scores-capability" }), line, list);
  return { element, refresh };
}

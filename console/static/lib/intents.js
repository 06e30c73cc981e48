// A call matched by meaning (semantic matching's cascade): each embedding model asked, in order, with its best
// capability and scores against its own threshold and margin; the last one decided (route/trace intent_stages).
// A model skipped for the intent's language (its calibration keeps it off it) says so.

import { h } from "./dom.js";

const score = (value) => (value === undefined || value === null ? null : value.toFixed(3));

function stageText(stage) {
  const best = stage.capability ? ` · best ${stage.capability} ${score(stage.score)}` : "";
  const runnerUp = score(stage.runner_up) === null ? "" : `, runner-up ${score(stage.runner_up)}`;
  const skipped = stage.language ? ` for ${stage.language} intents` : "";
  return `${stage.model}: ${stage.outcome}${skipped}${best}${runnerUp} (threshold ${score(stage.threshold)}, margin ${score(stage.margin)})`;
}

// [label, value] rows for a route or a trace; none for a call that named its capability.
export function intentFacts(matched) {
  const stages = matched.intent_stages;
  return stages && stages.length
    ? [["Matched by", h("ol", { class: "intent-stages" }, stages.map((stage) => h("li", { text: stageText(stage) })))]]
    : [];
}

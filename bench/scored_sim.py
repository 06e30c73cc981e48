"""Scored routing against the other policies on a synthetic trace: `python bench/scored_sim.py [--seeds 5]`.

A pure, in-process simulation (no sockets, no clocks: simulated time): calls arrive open loop (Poisson, at each of
``--rates`` per second, light and heavy, for ``--seconds``), each is routed by one policy, and answered after a
latency drawn from the chosen instance's trace. The router's own pieces decide: router/selection.py's
``plan_route`` (least_load, scored), router/measurements.py learning from every answer as the router does,
router/scoring.py. Random and round-robin are the baselines. No failover: each call's first choice is its outcome,
so the figures are the policy's alone.

The trace, four instances (SLA 1 s; past it a call times out at 1 s):
  a  10 ms, slows to 150 ms for the middle third of the run (a zone gone slow)
  b  25 ms throughout
  c  40 ms; from half-way to 80 % of the run, 40 % of its calls fail at once (2 ms: a fast-failing instance)
  d  80 ms throughout
Each latency is the instance's base times a lognormal jitter (sigma 0.3) times 1 + in-flight / 8 (an instance
serves 8 calls at once at full speed; more queue). Reported per policy, over ``--seeds`` seeds: mean and p99
latency of the calls answered, the error rate (failures and timeouts), and each instance's share of the calls
(least share: the smallest of them).
JSON in bench/results/scored_sim.json.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_reach.atp import ErrorCode

from common import RESULTS, ROOT, rank_at
from mesh.policy import DEFAULT_EXPLORE_SHARE
from router.candidate import Candidate
from router.measurements import Measurements
from router.scoring import Scoring
from router.selection import RoutePlan, plan_route
from router.transports.answer import AgentAnswer

SLA_MS = 1000
CAPACITY = 8
JITTER_SIGMA = 0.3
POLICIES = ("random", "round_robin", "least_load", "scored")


class Instance:
    """One simulated instance: its latency and failures at a point of the run (0..1), and its calls in flight."""

    def __init__(self, name: str, base_ms: float, slow: tuple[float, float, float] | None = None,
                 failing: tuple[float, float, float] | None = None):
        self.name = name
        self.base_ms = base_ms
        self.slow = slow  # (from, to, ms)
        self.failing = failing  # (from, to, failure share)
        self.inflight = 0

    def answer(self, at: float, rng: random.Random) -> tuple[float, ErrorCode | None]:
        """How long a call sent now takes and how it ends."""
        if self.failing is not None and self.failing[0] <= at < self.failing[1] and rng.random() < self.failing[2]:
            return 2.0, ErrorCode.AGENT_ERROR
        base = self.slow[2] if self.slow is not None and self.slow[0] <= at < self.slow[1] else self.base_ms
        ms = base * rng.lognormvariate(0, JITTER_SIGMA) * (1 + self.inflight / CAPACITY)
        return (SLA_MS, ErrorCode.TOTAL_TIMEOUT) if ms > SLA_MS else (ms, None)


def trace() -> list[Instance]:
    return [Instance("a", 10, slow=(1 / 3, 2 / 3, 150)), Instance("b", 25),
            Instance("c", 40, failing=(0.5, 0.8, 0.4)), Instance("d", 80)]


Choose = Callable[[list[Candidate], random.Random], str]


def by_plan(policy: str) -> Choose:
    scoring = Scoring() if policy == "scored" else None

    def choose(candidates: list[Candidate], rng: random.Random) -> str:
        plan = plan_route(candidates, policy_name=policy, hash_key="", routing_hint=None,  # type: ignore[arg-type]
                          sticky_agent=None, rng=rng, scoring=scoring)
        assert isinstance(plan, RoutePlan)
        return plan.order[0].agent_id
    return choose


def round_robin() -> Choose:
    turn = itertools.count()
    return lambda candidates, rng: candidates[next(turn) % len(candidates)].agent_id


def choosers() -> dict[str, Choose]:
    return {"random": lambda candidates, rng: rng.choice(candidates).agent_id, "round_robin": round_robin(),
            "least_load": by_plan("least_load"), "scored": by_plan("scored")}


def simulate(choose: Choose, seed: int, rate: float, seconds: float) -> dict[str, Any]:
    """One run of the trace under one policy; the same seed gives every policy the same arrivals."""
    arrivals, answers, routing = random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)
    instances = {instance.name: instance for instance in trace()}
    measurements = Measurements()
    pending: list[tuple[float, int, str, AgentAnswer]] = []  # (done at, tiebreak, instance, answer)
    latencies: list[float] = []
    errors = 0
    served: Counter[str] = Counter()
    now, sequence = 0.0, itertools.count()
    while True:
        now += arrivals.expovariate(rate)
        if now >= seconds:
            break
        while pending and pending[0][0] <= now:
            _, _, name, answer = heapq.heappop(pending)
            instances[name].inflight -= 1
            measurements.observe("sim", name, answer)
        candidates = [Candidate(agent_id=name, endpoint="", protocol="rest", state="healthy",
                                inflight=instance.inflight, measured=measurements.get("sim", name), sla_ms=SLA_MS)
                      for name, instance in instances.items()]
        name = choose(candidates, routing)
        instance = instances[name]
        ms, code = instance.answer(now / seconds, answers)
        instance.inflight += 1
        heapq.heappush(pending, (now + ms / 1000, next(sequence), name,
                                 AgentAnswer(error_code=code, elapsed_ms=ms, result=None if code else {})))
        served[name] += 1
        if code is None:
            latencies.append(ms)
        else:
            errors += 1
    latencies.sort()
    calls = sum(served.values())
    return {"calls": calls, "mean_ms": sum(latencies) / len(latencies), "p99_ms": rank_at(latencies, 0.99),
            "error_rate": errors / calls, "share": {name: served[name] / calls for name in instances}}


def run(seeds: int, rate: float, seconds: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in POLICIES}
    for seed in range(seeds):
        for policy, choose in choosers().items():
            runs[policy].append(simulate(choose, seed, rate, seconds))
    summary = {}
    for policy, results in runs.items():
        names = results[0]["share"]
        summary[policy] = {
            "mean_ms": sum(r["mean_ms"] for r in results) / seeds, "p99_ms": sum(r["p99_ms"] for r in results) / seeds,
            "error_rate": sum(r["error_rate"] for r in results) / seeds,
            "share": {name: sum(r["share"][name] for r in results) / seeds for name in names}}
        summary[policy]["least_share"] = min(summary[policy]["share"].values())
    return {"summary": summary, "runs": runs}


def print_table(rate: float, summary: dict[str, Any]) -> None:
    names = list(next(iter(summary.values()))["share"])
    print(f"\n{rate:g} calls/s:\n")
    print("| policy | mean | p99 | errors | " + " | ".join(f"share {name}" for name in names) + " | least share |")
    print("|---|---:|---:|---:|" + "---:|" * len(names) + "---:|")
    for policy, row in summary.items():
        shares = " | ".join(f"{row['share'][name]:.1%}" for name in names)
        print(f"| {policy} | {row['mean_ms']:.1f} ms | {row['p99_ms']:.1f} ms | {row['error_rate']:.2%} | {shares} | "
              f"{row['least_share']:.1%} |")
    scored = summary["scored"]
    best_p99 = all(scored["p99_ms"] <= row["p99_ms"] for row in summary.values())
    # Exploration guarantees the share on average: a tenth under it is chance over a few thousand calls.
    fed = scored["least_share"] >= 0.9 * DEFAULT_EXPLORE_SHARE
    print(f"\nscored best on p99 at {rate:g}/s: {'met' if best_p99 else 'MISSED'}; every instance near "
          f"explore_share ({DEFAULT_EXPLORE_SHARE:.0%}) or more under scored: {'met' if fed else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="runs per policy (the figures are their means)")
    parser.add_argument("--rates", default="50,200", help="calls per simulated second, one run set per rate")
    parser.add_argument("--seconds", type=float, default=120.0, help="simulated seconds per run")
    parser.add_argument("--json", type=Path, default=RESULTS / "scored_sim.json")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    summaries = {}
    for rate in rates:
        summaries[f"{rate:g}"] = summary = run(args.seeds, rate, args.seconds)["summary"]
        print_table(rate, summary)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"settings": {"seeds": args.seeds, "rates": rates, "seconds": args.seconds},
                                     "summary_by_rate": summaries}, indent=2) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()

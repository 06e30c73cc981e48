"""How far a client's budget is overshot by calls in flight, one command: `python bench/budget_overshoot_bench.py`.

Issue 25's scenarios (tests/budget_overshoot.py), against real servers on 127.0.0.1: a registry, two routers
following it over HTTP, a metered agent spending what each payload asks for, one client with a 1,000-token daily
budget per scenario.
- burst: 5 one-token calls per router (the router learns the client's calls are tiny), then 80 calls of 200
  tokens fired at once, 40 per router; once without and once with `context.max_tokens: 200` declared.
- cold start: from the client's first call, 8 callers per router calling steadily (100 tokens a call) until each
  router has refused it 3 times.
Reported: tokens spent by the calls answered, against the budget and issue 25's target (budget + one largest
call per router). Results: a table on stdout, JSON in bench/results/budget_overshoot_bench.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from common import RESULTS, ROOT, machine

sys.path.insert(0, str(ROOT / "tests"))
from budget_overshoot import Overshoot, budget_mesh, budgeted_client, cold_start, concurrent_burst

BUDGET = 1000


async def scenarios(data: Path) -> list[Overshoot]:
    async with budget_mesh(data) as mesh_of:
        results = [await concurrent_burst(mesh_of, await budgeted_client(mesh_of, BUDGET), budget=BUDGET)]
        results.append(await concurrent_burst(mesh_of, await budgeted_client(mesh_of, BUDGET), budget=BUDGET,
                                              context={"max_tokens": 200}, scenario="burst, declared"))
        results.append(await cold_start(mesh_of, await budgeted_client(mesh_of, BUDGET), budget=BUDGET, tokens=100))
    return results


def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        results = asyncio.run(scenarios(Path(data)))
    print(f"{'scenario':<18}{'budget':>8}{'spent':>8}{'x budget':>10}{'target':>8}{'answered':>10}{'refused':>9}")
    for result in results:
        print(f"{result.scenario:<18}{result.budget:>8}{result.spent:>8}{result.spent / result.budget:>10.2f}"
              f"{result.bound:>8}{result.answered:>10}{result.refused:>9}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "budget_overshoot_bench.json").write_text(json.dumps(
        {"machine": machine(), "results": [{**{f: getattr(r, f) for f in r.__struct_fields__}, "target": r.bound}
                                           for r in results]}, indent=2))


if __name__ == "__main__":
    main()

"""The common call builds nothing it already has (issue 18): the reach ledger makes a capability's tallies
on its first call in a period only. Pinned beside the case that still builds (a new capability)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import router.reach
from router_support import Mesh


def calls_to(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple[Any, ...]]:
    """Each call's arguments to ``owner.name`` from now on (the call itself still made)."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(owner, name)

    def counted(*args: Any) -> Any:
        calls.append(args)
        return original(*args)
    monkeypatch.setattr(owner, name, counted)
    return calls


async def test_tallies_are_built_on_a_capability_s_first_call_in_a_period_only(
        mesh: Mesh, start_agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await mesh.add(await start_agent("a"))
    await mesh.add(await start_agent("b"), "other")
    built = calls_to(monkeypatch, router.reach, "Tally")
    for n in range(3):
        assert (await mesh.call("echo", {"n": n})).status == 200
    # one lifetime tally, and one per period the calls fell in (two if they straddle a period boundary)
    periods = mesh.router.ledger.periods("echo", now=time.time())
    assert len(built) == 1 + len(periods)
    assert sum(period.total for period in periods) == 3
    before = len(built)
    assert (await mesh.call("other", {})).status == 200
    assert len(built) == before + 2
    assert (await mesh.reach_totals("echo"))["success"] == 3

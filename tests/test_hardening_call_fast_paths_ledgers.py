"""The common call builds nothing it already has (issue 18): the reach ledger makes a capability's tallies
on its first call in a period only, an offer's version is worked out when the feed changes it rather than
per candidate per call, and a quality lookup builds no empty mapping. Each is pinned beside the case that
still builds (a new capability, a changed record)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from agent_reach.registration import Capability

import router.mirror
import router.reach
from mesh.keyspace import KeySpace
from mesh.quality import QualityScore
from mesh.records import InstanceRecord, instance_key
from mesh.watch import InstanceState, Put, Reset
from router.mirror import RegistryMirror
from router_support import Mesh

HEALTHY = InstanceState("healthy", 0.0, None)


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


def record(agent_id: str, version: str, semver: str | None = None) -> InstanceRecord:
    return InstanceRecord(agent_id=agent_id, service="echo", health_url="http://127.0.0.1:9/healthz",
                          metadata={"semver": semver} if semver else {},
                          capabilities=[Capability(name="echo", endpoint="http://127.0.0.1:9/echo", protocol="rest",
                                                   version=version)])


def test_an_offer_s_version_is_worked_out_when_the_feed_changes_it_not_per_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    worked = calls_to(monkeypatch, router.mirror, "instance_version")
    mirror = RegistryMirror()
    mirror.apply(Reset(revision=1, records={instance_key("a"): record("a", "3.2.0"),
                                            instance_key("b"): record("b", "1.0", semver="4.1.0")},
                       states={"a": HEALTHY, "b": HEALTHY}))
    for _ in range(5):
        offers = mirror.offers("echo")
        assert offers is not None
        assert {offer.record.agent_id: offer.version for offer in offers} == {"a": "3.2.0", "b": "4.1.0"}
    assert len(worked) == 2
    mirror.apply(Put(revision=2, key=instance_key("b"), value=record("b", "1.0", semver="4.2.0")))
    for _ in range(5):
        offers = mirror.offers("echo")
        assert offers is not None
        assert {offer.record.agent_id: offer.version for offer in offers} == {"a": "3.2.0", "b": "4.2.0"}
    assert len(worked) == 4


class WatchedScores(dict[str, dict[str, QualityScore]]):
    """The quality table, noting the default each lookup brings along."""

    def __init__(self, scores: dict[str, dict[str, QualityScore]], defaults: list[tuple[Any, ...]]):
        super().__init__(scores)
        self.defaults = defaults

    def get(self, key: Any, *default: Any) -> Any:
        self.defaults.append(default)
        return super().get(key, *default)


def test_a_quality_lookup_builds_no_empty_mapping() -> None:
    mirror = RegistryMirror()
    keys = KeySpace()
    defaults: list[tuple[Any, ...]] = []
    keys.quality = WatchedScores({"echo": {"a": QualityScore(score=0.75)}}, defaults)
    mirror.keys = keys
    assert mirror.quality("echo", "a") == 0.75
    assert mirror.quality("echo", "b") is None
    assert mirror.quality("unscored", "a") is None
    assert defaults == [(), (), ()]

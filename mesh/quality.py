"""Quality scores: an operator's (or a scheduled golden-set job's) verdict on one instance of one capability.

Stored like policies, so every router's mirror holds them: the scored policy reads them, and an
instance scoring below its capability's policy ``quality_floor`` leaves rotation (it is not evicted)
while the registry raises an alert. One record per (capability, agent_id): an instance answers one
capability well and another badly. A score outlives its instance's registration, so an instance that
restarts under its agent_id keeps its verdict until an operator deletes or replaces it, or the registry
forgets the agent_id (registry/bindings.py) and the score with it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated

import msgspec

from mesh.policy import Policy

QUALITY_PREFIX = "quality/"
# Enough for a job's name and a date ("golden-set-2026-12"), or a link to a report.
MAX_SOURCE_CHARS = 256

Score = Annotated[float, msgspec.Meta(ge=0, le=1)]


class QualityScore(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One instance's quality for one capability. A stored format (mesh/records.py): change only with a migration."""

    score: float
    source: str | None = None
    posted_at: float = 0.0


class QualityPost(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of PUT /quality/{capability}/{agent_id}: 0 is useless, 1 is perfect."""

    score: Score
    source: Annotated[str, msgspec.Meta(max_length=MAX_SOURCE_CHARS)] | None = None


class QualityView(msgspec.Struct, kw_only=True):
    """What the admin API shows of one instance's score, judged against its capability's policy now."""

    capability: str
    agent_id: str
    score: float
    source: str | None
    posted_at: float
    floor: float | None
    below_floor: bool


class QualityAlert(msgspec.Struct, kw_only=True, frozen=True):
    """A live instance out of rotation for its quality: raised while its score is below the floor."""

    capability: str
    agent_id: str
    score: float
    floor: float
    source: str | None
    posted_at: float


def quality_key(capability: str, agent_id: str) -> str:
    return f"{QUALITY_PREFIX}{capability}/{agent_id}"


def split_quality_key(key: str) -> tuple[str, str]:
    """(capability, agent_id) of a quality key (neither name holds a '/')."""
    capability, _, agent_id = key[len(QUALITY_PREFIX):].partition("/")
    return capability, agent_id


def quality_floor(policy: Policy | None) -> float | None:
    """The score an instance needs to stay in rotation; None when the capability's policy sets no floor."""
    return policy.min_quality if policy is not None else None


def below_floor(score: float, floor: float | None) -> bool:
    return floor is not None and score < floor


def quality_view(capability: str, agent_id: str, score: QualityScore, floor: float | None) -> QualityView:
    return QualityView(capability=capability, agent_id=agent_id, score=score.score, source=score.source,
                       posted_at=score.posted_at, floor=floor, below_floor=below_floor(score.score, floor))


def quality_alert(capability: str, agent_id: str, score: QualityScore | None, policy: Policy | None,
                  live: bool) -> QualityAlert | None:
    """The alert a live instance scored below its capability's floor raises; None otherwise (an instance
    that takes no calls raises nothing)."""
    floor = quality_floor(policy)
    if score is None or not live or floor is None or not below_floor(score.score, floor):
        return None
    return QualityAlert(capability=capability, agent_id=agent_id, score=score.score, floor=floor, source=score.source,
                        posted_at=score.posted_at)


def quality_alerts(scores: dict[str, dict[str, QualityScore]], policies: dict[str, Policy],
                   offers: Mapping[str, Collection[str]]) -> list[QualityAlert]:
    """Every alert raised now (``offers``: capability -> the agent_ids offering it now), by capability then agent_id."""
    found = (quality_alert(capability, agent_id, score, policies.get(capability),
                           agent_id in offers.get(capability, ()))
             for capability in sorted(scores) for agent_id, score in sorted(scores[capability].items()))
    return [alert for alert in found if alert is not None]

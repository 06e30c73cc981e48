"""Quality scores at the registry: operators (or their golden-set jobs) post one per instance and capability.

The score is durable like a policy (the WAL, or etcd) and reaches every router over the watch feed
(mesh/quality.py); a score is taken only for a capability some live instance offers, and only for an
instance that declares it, so a typo is a 404 rather than a record nothing ever reads. A live instance
scored below its capability's policy ``quality_floor`` is alerting (GET /quality); each registry node
logs the alert (``quality_alert``, like the routers' ``reach_alert``) when a committed change raises it,
and again when one resolves it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mesh.quality import (
    QUALITY_PREFIX,
    QualityAlert,
    QualityPost,
    QualityScore,
    QualityView,
    quality_alert,
    quality_alerts,
    quality_floor,
    quality_key,
    quality_view,
    split_quality_key,
)
from mesh.records import POLICY_PREFIX, encode_value, instance_id
from registry.state import RegistryState
from registry.store import Store
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.quality")


class Quality:
    def __init__(self, store: Store, state: RegistryState, wall_clock: Callable[[], float]):
        self._store = store
        self._state = state
        self._wall_clock = wall_clock
        # (capability, agent_id) -> the alert raised now: kept up to date by every committed change (noticed).
        keys = state.keys
        self._alerting = {(alert.capability, alert.agent_id): alert
                          for alert in quality_alerts(keys.quality, keys.policies, keys.offers)}
        for alert in self._alerting.values():
            _log_raised(alert)

    def scores(self, capability: str) -> list[QualityView]:
        """Every score stored for ``capability``, by agent_id; empty when none is."""
        scores = self._state.keys.quality.get(capability, {})
        floor = quality_floor(self._state.policies.get(capability))
        return [quality_view(capability, agent_id, scores[agent_id], floor) for agent_id in sorted(scores)]

    def alerts(self) -> list[QualityAlert]:
        """The alerts raised now, by capability then agent_id."""
        return [self._alerting[ref] for ref in sorted(self._alerting)]

    def _affected(self, key: str) -> set[tuple[str, str]]:
        """(capability, agent_id) of every score a committed change to ``key`` may raise or resolve."""
        scores = self._state.keys.quality
        if key.startswith(QUALITY_PREFIX):
            return {split_quality_key(key)}
        if key.startswith(POLICY_PREFIX):
            capability = key[len(POLICY_PREFIX):]
            return {(capability, agent_id) for agent_id in scores.get(capability, {})}
        agent_id = instance_id(key)
        if agent_id is None:
            return set()
        return {(capability, agent_id) for capability, scored in scores.items() if agent_id in scored}

    def noticed(self, key: str) -> None:
        """A committed change: a score, a policy (its floor) or an instance (live or not) may raise or resolve
        alerts; only the scores it touches are judged again, so a registration costs no scan of every score."""
        keys = self._state.keys
        for capability, agent_id in self._affected(key):
            ref = (capability, agent_id)
            alert = quality_alert(capability, agent_id, keys.quality.get(capability, {}).get(agent_id),
                                  keys.policies.get(capability), agent_id in keys.offers.get(capability, {}))
            if alert is not None and ref not in self._alerting:
                _log_raised(alert)
            elif alert is None and ref in self._alerting:
                log.info("quality_alert", extra={"capability": capability, "agent_id": agent_id, "state": "resolved"})
            if alert is None:
                self._alerting.pop(ref, None)
            else:
                self._alerting[ref] = alert

    def _check_scorable(self, capability: str, agent_id: str) -> None:
        keys = self._state.keys
        if capability not in keys.offers:
            raise ApiError(404, "unknown_capability", f"No live instance offers {capability!r}", "capability")
        record = keys.records.get(agent_id)
        if record is None or all(offered.name != capability for offered in record.capabilities):
            raise ApiError(404, "unknown_agent", f"No instance {agent_id!r} offers {capability!r}", "agent_id")

    async def put(self, capability: str, agent_id: str, post: QualityPost) -> QualityView:
        self._check_scorable(capability, agent_id)
        score = QualityScore(score=post.score, source=post.source, posted_at=self._wall_clock())
        await self._store.put(quality_key(capability, agent_id), encode_value(score))
        log.info("quality score saved", extra={"capability": capability, "agent_id": agent_id, "score": post.score,
                                               "source": post.source})
        return quality_view(capability, agent_id, score, quality_floor(self._state.policies.get(capability)))

    async def delete(self, capability: str, agent_id: str) -> None:
        if agent_id not in self._state.keys.quality.get(capability, {}):
            raise ApiError(404, "quality_not_found", f"No quality score for {agent_id!r} on {capability!r}",
                           "agent_id")
        await self._store.delete(quality_key(capability, agent_id))
        log.info("quality score deleted", extra={"capability": capability, "agent_id": agent_id})

    async def forget(self, agent_id: str) -> None:
        """Delete every score of an agent_id the registry forgets (its binding dropped: it cannot come back
        as the same instance), so scores are bounded by the instances and bindings kept."""
        for capability in [name for name, scored in self._state.keys.quality.items() if agent_id in scored]:
            await self._store.delete(quality_key(capability, agent_id))
            log.info("quality score forgotten with its agent_id", extra={"capability": capability,
                                                                         "agent_id": agent_id})


def _log_raised(alert: QualityAlert) -> None:
    log.warning("quality_alert", extra={"capability": alert.capability, "agent_id": alert.agent_id, "state": "active",
                                        "score": alert.score, "floor": alert.floor, "source": alert.source})

"""Quality scores at the registry: operators (or their golden-set jobs) post one per instance and capability.

The score is durable like a policy (the WAL, or etcd) and reaches every router over the watch feed
(mesh/quality.py); a score is taken only for a capability some live instance offers, and only for an
instance that declares it, so a typo is a 404 rather than a record nothing ever reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mesh.quality import QualityPost, QualityScore, QualityView, quality_key, quality_view
from mesh.records import encode_value
from registry.state import RegistryState
from registry.store import Store
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.quality")


class Quality:
    def __init__(self, store: Store, state: RegistryState, wall_clock: Callable[[], float]):
        self._store = store
        self._state = state
        self._wall_clock = wall_clock

    def list(self, capability: str) -> list[QualityView]:
        """Every score stored for ``capability``, by agent_id; empty when none is."""
        scores = self._state.keys.quality.get(capability, {})
        return [quality_view(capability, agent_id, scores[agent_id]) for agent_id in sorted(scores)]

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
        return quality_view(capability, agent_id, score)

    async def delete(self, capability: str, agent_id: str) -> None:
        if agent_id not in self._state.keys.quality.get(capability, {}):
            raise ApiError(404, "quality_not_found", f"No quality score for {agent_id!r} on {capability!r}",
                           "agent_id")
        await self._store.delete(quality_key(capability, agent_id))
        log.info("quality score deleted", extra={"capability": capability, "agent_id": agent_id})

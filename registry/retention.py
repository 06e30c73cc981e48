"""How much eviction history the registry keeps: the newest evicted records, for a while
(LifecycleConfig.kept_evicted and evicted_max_age: 1,000 for a day unless told otherwise).

An evicted instance's record stays visible in /agents (decision 5: operators want to see what
left and when), but agents churn: kept for ever, evicted records grow without bound in memory, in
every snapshot and in every router's mirror. Only the newest are kept; older ones are released as a
deregistration is, so their agent_ids stay their services'.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter

from mesh.records import InstanceRecord


def evicted_to_forget(records: Iterable[InstanceRecord], now: float, kept: int, max_age: float) -> list[str]:
    """agent_ids of evicted records past the newest ``kept`` or evicted over ``max_age`` seconds before
    ``now`` (wall clock, as ``evicted_at``), oldest first."""
    evicted = sorted(((record.evicted_at, record.agent_id) for record in records if record.evicted_at is not None),
                     key=itemgetter(0))
    surplus = len(evicted) - kept
    return [agent_id for position, (evicted_at, agent_id) in enumerate(evicted)
            if position < surplus or now - evicted_at > max_age]

"""Router-side facts about instances that the registry does not know: in-flight calls, rate
buckets, breakers and passive ejections. Only the router's own traffic changes them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mesh.policy import BreakerConfig
from router.breaker import BreakerState, CircuitBreaker
from router.ratelimit import SharedBuckets, TokenBucket, whole_share

EJECT_BASE_SECONDS = 2.0
EJECT_MAX_SECONDS = 60.0
# Doublings past this are past EJECT_MAX_SECONDS anyway; without the cap a long outage's strike count
# overflows a float (2.0 * 2 ** 1024 does), and every call to the instance would fail in the router.
_MAX_DOUBLINGS = 16


class Ejection:
    """An instance that refused connections: out of rotation for a while, longer each time in a row."""

    def __init__(self) -> None:
        self.until = 0.0
        self.strikes = 0

    def eject(self, now: float) -> float:
        self.strikes += 1
        seconds = min(EJECT_MAX_SECONDS, EJECT_BASE_SECONDS * 2.0 ** min(self.strikes - 1, _MAX_DOUBLINGS))
        self.until = now + seconds
        return seconds


class InstanceBook:
    def __init__(self, share: Callable[[], float] = whole_share) -> None:
        """``share``: this router's fraction of every instance's ``max_qps`` (1 / live routers)."""
        self.inflight: dict[str, int] = {}
        self._buckets = SharedBuckets(share)
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}
        self._ejections: dict[str, Ejection] = {}

    def bucket(self, agent_id: str, max_qps: float) -> TokenBucket:
        """The instance's bucket at this router's share of its ``max_qps``."""
        return self._buckets.get(agent_id, max_qps)

    def breaker(self, scope: str, name: str, config: BreakerConfig) -> CircuitBreaker:
        """The breaker of an instance (scope = capability) or of a capability (scope = "")."""
        breaker = self._breakers.get((scope, name))
        # Nearly always the very object (the mirror's policy): compared field by field only when it is not.
        if breaker is None or (breaker.config is not config and breaker.config != config):
            breaker = self._breakers[(scope, name)] = CircuitBreaker(config)
        return breaker

    def breakers(self) -> Iterator[tuple[tuple[str, str], CircuitBreaker]]:
        return iter(self._breakers.items())

    def ejected(self, agent_id: str, now: float) -> bool:
        ejection = self._ejections.get(agent_id)
        return ejection is not None and now < ejection.until

    def eject(self, agent_id: str, now: float) -> float:
        return self._ejections.setdefault(agent_id, Ejection()).eject(now)

    def reinstate(self, agent_id: str) -> None:
        self._ejections.pop(agent_id, None)

    def available(self, capability: str, agent_id: str, config: BreakerConfig, now: float) -> bool:
        if self.ejected(agent_id, now):
            return False
        return self.breaker(capability, agent_id, config).state(now) is not BreakerState.OPEN

    def forget(self, live: set[str]) -> None:
        """Drop what belongs to instances that left the registry."""
        self._buckets.forget(live)
        for key in [k for k in self._breakers if k[0] and k[1] not in live]:
            del self._breakers[key]
        for agent_id in [a for a in self._ejections if a not in live]:
            del self._ejections[agent_id]

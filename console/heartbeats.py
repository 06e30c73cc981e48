"""Heartbeat history the registry does not keep: the console notices each beat as it polls.

The registry only knows an instance's last heartbeat (as an age); polling every second, the
console sees that age fall whenever a new beat arrived and rebuilds the beat's time from it.
State changes are kept alongside, so an agent's page can show when it went silent.
"""

from __future__ import annotations

from collections import deque

from console.models import Beat, Transition
from registry.views import AgentView

BEATS_KEPT = 120
TRANSITIONS_KEPT = 50
# Two readings of the same beat differ by the polls' network jitter; a new beat is further on.
SAME_BEAT_SECONDS = 0.05


class HeartbeatLog:
    def __init__(self) -> None:
        self._beats: dict[str, deque[Beat]] = {}
        self._transitions: dict[str, deque[Transition]] = {}
        self._state: dict[str, str] = {}

    def observe(self, agents: list[AgentView], now: float) -> None:
        """Record new beats and state changes from one poll; forget instances that left."""
        present = set()
        for agent in agents:
            present.add(agent.agent_id)
            self._note_state(agent, now)
            if agent.last_heartbeat_ms_ago is None:
                continue
            beats = self._beats.setdefault(agent.agent_id, deque(maxlen=BEATS_KEPT))
            at = now - agent.last_heartbeat_ms_ago / 1000
            if not beats or at > beats[-1].at + SAME_BEAT_SECONDS:
                beats.append(Beat(at=round(at, 3), load=agent.load, inflight=agent.inflight, state=agent.state))
        for gone in set(self._state) - present:
            self._state.pop(gone)
            self._beats.pop(gone, None)
            self._transitions.pop(gone, None)

    def _note_state(self, agent: AgentView, now: float) -> None:
        previous = self._state.get(agent.agent_id)
        if previous != agent.state:
            self._state[agent.agent_id] = agent.state
            self._transitions.setdefault(agent.agent_id, deque(maxlen=TRANSITIONS_KEPT)).append(
                Transition(at=round(now, 3), previous=previous, state=agent.state))

    def beats(self, agent_id: str) -> list[Beat]:
        return list(self._beats.get(agent_id, ()))

    def transitions(self, agent_id: str) -> list[Transition]:
        return list(self._transitions.get(agent_id, ()))

"""Degraded answers of L1 capabilities: each one is logged and keeps the capability's alert up to date
(GET /alerts "degraded"), so an operator sees that a capability that may degrade is doing so. L2
capabilities degrade silently; L0 ones never do (their policy cannot say how)."""

from __future__ import annotations

import logging

import msgspec

log = logging.getLogger("agentreach.router")


class DegradedAlert(msgspec.Struct, kw_only=True):
    capability: str
    answers: int  # degraded answers since the router started
    first_at: float  # unix seconds
    last_at: float
    last_reason: str | None  # failover, fallback, fixed_answer, pending, demoted, a rule's reason


class DegradationAlerts:
    def __init__(self) -> None:
        self._alerts: dict[str, DegradedAlert] = {}

    def degraded(self, capability: str, reason: str | None, request_id: str, now: float) -> None:
        alert = self._alerts.get(capability)
        if alert is None:
            alert = self._alerts[capability] = DegradedAlert(capability=capability, answers=0, first_at=now,
                                                             last_at=now, last_reason=reason)
        alert.answers, alert.last_at, alert.last_reason = alert.answers + 1, now, reason
        log.warning("degraded_answer", extra={"capability": capability, "reason": reason, "request_id": request_id,
                                              "level": "L1", "answers": alert.answers})

    def alerts(self) -> list[DegradedAlert]:
        return sorted(self._alerts.values(), key=lambda alert: -alert.last_at)

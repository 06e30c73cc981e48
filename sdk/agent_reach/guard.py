"""Which incoming calls reach a handler: those the router signed, and declared direct fallback calls.

The seed's rule is that nothing calls an agent around the mesh, except a caller's direct
fallback when the router is unreachable, and only for agents that declared ``direct_fallback``.
An agent holding a registration token therefore refuses unsigned calls, with one exception: an
unsigned call marked ``X-Reach-Direct: 1`` when the agent declared the fallback. A call that
carries a signature must carry a valid one, marked or not.

The path checked is the one the agent registered for the capability, not the one the request
arrived on, so an agent behind a proxy that rewrites paths still verifies the router's intent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from agent_reach.signing import DEFAULT_WINDOW_S, DIRECT_HEADER, SIGNATURE_HEADER, verify

log = logging.getLogger("agentreach.sdk")


class CallGuard:
    def __init__(self, agent_id: str, key: str | None, direct_fallback: bool, window_s: float = DEFAULT_WINDOW_S):
        self.agent_id = agent_id
        # None: calls are not verified (no registration token, or verify_calls=False).
        self.key = key
        self.direct_fallback = direct_fallback
        self.window_s = window_s
        self._paths: dict[str, str] = {}

    @property
    def active(self) -> bool:
        return self.key is not None

    def expect(self, paths: Mapping[str, str]) -> None:
        """The path each capability was registered at (what the router signs), known once the agent starts."""
        self._paths = dict(paths)

    def refusal(self, capability: str, method: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """None when the call may proceed; otherwise why it may not (already logged)."""
        if self.key is None:
            return None
        request_id = headers.get("X-Request-Id", "")
        signed = headers.get(SIGNATURE_HEADER)
        if signed is None and headers.get(DIRECT_HEADER) == "1":
            if self.direct_fallback:
                log.warning("direct_call_accepted", extra={"capability": capability, "request_id": request_id,
                                                           "why": "declared direct fallback (router bypassed)"})
                return None
            reason = "direct calls are refused: this agent registered without direct_fallback"
        else:
            reason = verify(signed, self.key, method, self._paths.get(capability, ""), request_id, body,
                            window_s=self.window_s)
            if reason is None:
                return None
        log.warning("call_refused", extra={"capability": capability, "request_id": request_id, "reason": reason})
        return f"Agent {self.agent_id} refused the call: {reason}"

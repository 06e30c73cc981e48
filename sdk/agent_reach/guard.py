"""Which incoming calls reach a handler: those the router signed, and declared direct fallback calls.

The seed's rule is that nothing calls an agent around the mesh, except a caller's direct
fallback when the router is unreachable, and only for agents that declared ``direct_fallback``.
An agent holding a registration token therefore refuses unsigned calls, with one exception: an
unsigned call marked ``X-Reach-Direct: 1`` when the agent declared the fallback. A call that
carries a signature must carry a valid one, marked or not.

The path checked is the one the agent registered for the capability, not the one the request
arrived on, so an agent behind a proxy that rewrites paths still verifies the router's intent.
Each signature carries a nonce; one already accepted is refused as a replay for as long as its
signature could still verify. A signature names the instance it was made for, and the guard checks
it against its own agent_id, so a call captured on its way to a sibling instance (same service,
same key, its own nonce memory) does not verify here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from agent_reach.headers import DIRECT_HEADER, REQUEST_ID_HEADER, SIGNATURE_HEADER
from agent_reach.signing import DEFAULT_WINDOW_S, Signed, accepted

log = logging.getLogger("agentreach.sdk")

# Nonces remembered at most; past it the oldest are forgotten first (~20 MB at the limit).
MAX_REMEMBERED = 200_000


class SeenNonces:
    """Nonces of accepted signatures, each kept until its signature leaves the window."""

    def __init__(self, window_s: float, limit: int = MAX_REMEMBERED):
        self.window_s = window_s
        self.limit = limit
        # Insertion order is nearly expiry order (timestamps arrive nearly in order), so expired
        # nonces are found at the front.
        self._until: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def first_time(self, nonce: str, timestamp: int, now: float) -> bool:
        """Remember ``nonce``; False when it was accepted before (a replay)."""
        until = self._until
        while until:
            oldest = next(iter(until))
            if until[oldest] >= now and len(until) < self.limit:
                break
            del until[oldest]
        if nonce in until:
            return False
        until[nonce] = timestamp + self.window_s
        return True


class CallGuard:
    def __init__(self, agent_id: str, key: str | None, direct_fallback: bool, window_s: float = DEFAULT_WINDOW_S):
        self.agent_id = agent_id
        # None: calls are not verified (no registration token, or verify_calls=False).
        self.key = key
        self.direct_fallback = direct_fallback
        self.window_s = window_s
        self._paths: dict[str, str] = {}
        self._seen = SeenNonces(window_s)

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
        request_id = headers.get(REQUEST_ID_HEADER, "")
        signed = headers.get(SIGNATURE_HEADER)
        if signed is None and headers.get(DIRECT_HEADER) == "1":
            if self.direct_fallback:
                log.warning("direct_call_accepted", extra={"capability": capability, "request_id": request_id,
                                                           "why": "declared direct fallback (router bypassed)"})
                return None
            reason = "direct calls are refused: this agent registered without direct_fallback"
        else:
            checked = accepted(signed, self.key, self.agent_id, method, self._paths.get(capability, ""), request_id,
                               body, window_s=self.window_s)
            if isinstance(checked, str):
                reason = checked
            elif self._seen.first_time(checked.nonce, checked.timestamp, time.time()):
                return None
            else:
                reason = "replayed: this signed request was already accepted"
        log.warning("call_refused", extra={"capability": capability, "request_id": request_id, "reason": reason})
        return f"Agent {self.agent_id} refused the call: {reason}"

    def signed_for(self, destination: str, method: str, path: str, headers: Mapping[str, str],
                   body: bytes) -> Signed | str:
        """The signature when ``headers`` sign this call to ``destination`` (a message queue's request stream:
        whichever instance takes it), else why not; the replay check is the caller's (the stream's instances
        share their nonces in the broker, agent_reach.mq_serving). Only while ``active``."""
        assert self.key is not None
        return accepted(headers.get(SIGNATURE_HEADER), self.key, destination, method, path,
                        headers.get(REQUEST_ID_HEADER, ""), body, window_s=self.window_s)

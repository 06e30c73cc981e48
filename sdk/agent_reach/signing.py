"""Signatures on the calls the router forwards, so an agent can tell them from calls around the mesh.

The key is derived from the agent's registration token (HMAC-SHA256 with a fixed label): the
registry stores it with the token (sealed), the router signs with it, and the agent derives it from
the token it already holds, so no second secret is distributed. The signature binds the time, a
random nonce (so an agent can refuse a replayed request), the destination instance's agent_id
(instances of one service share the key, and each remembers only the nonces it accepted, so
without it a call to one instance could be replayed to its siblings), the HTTP method, the target
path, the request id and the body's SHA-256:

    X-Reach-Signature: v2,t=<unix seconds>,n=<24 hex>,s=<hex HMAC-SHA256(key,
                       "t\\nnonce\\nagent_id\\nMETHOD\\npath\\nrequest_id\\nsha256(body)")>

Only the path can hold a newline (once decoded) and every other field has a fixed form (an
agent_id is a registry name), so the signed string parses one way only. A v1 signature (no
agent_id) is refused as malformed. Pure functions: no clock or randomness unless ``now`` or
``nonce`` is left out.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from typing import NamedTuple

from agent_reach.headers import SIGNATURE_HEADER

VERSION = "v2"
DEFAULT_WINDOW_S = 60.0
# The path a gRPC call's signature names, whatever its method (agent_reach.grpc_wire): the gRPC service.
GRPC_SIGNED_PATH = "/agentreach.v1.Agent"

_LABEL = b"agentreach forward signing v1"


def signing_key(registration_token: str) -> str:
    """The key the router signs forwarded calls with, derived from the service's registration token."""
    return hmac.new(registration_token.encode(), _LABEL, hashlib.sha256).hexdigest()


def signature(key: str, timestamp: int, nonce: str, agent_id: str, method: str, path: str, request_id: str,
              body: bytes) -> str:
    signed = f"{timestamp}\n{nonce}\n{agent_id}\n{method}\n{path}\n{request_id}\n{hashlib.sha256(body).hexdigest()}"
    return hmac.digest(key.encode(), signed.encode(), "sha256").hex()


def sign(key: str, agent_id: str, method: str, path: str, request_id: str, body: bytes, now: float | None = None,
         nonce: str | None = None) -> str:
    """The ``X-Reach-Signature`` value for one request to the instance ``agent_id``."""
    timestamp = int(time.time() if now is None else now)
    nonce = nonce or os.urandom(12).hex()
    signed = signature(key, timestamp, nonce, agent_id, method, path, request_id, body)
    return f"{VERSION},t={timestamp},n={nonce},s={signed}"


class Signed(NamedTuple):
    timestamp: int
    nonce: str
    digest: str


_NONCE = re.compile(r"[0-9a-f]{24}")
# Seconds since the epoch in ASCII digits (str.isdigit also takes "²", which int() refuses), short enough
# that no arithmetic on it overflows a float.
_STAMP = re.compile(r"[0-9]{1,12}")


def parse(header: str) -> Signed | None:
    version, _, rest = header.partition(",")
    fields = dict(part.partition("=")[::2] for part in rest.split(","))
    stamp, nonce, digest = fields.get("t", ""), fields.get("n", ""), fields.get("s", "")
    if version.strip() != VERSION or not _STAMP.fullmatch(stamp) or not _NONCE.fullmatch(nonce) or len(digest) != 64:
        return None
    return Signed(int(stamp), nonce, digest)


def verify(header: str | None, key: str, agent_id: str, method: str, path: str, request_id: str, body: bytes,
           now: float | None = None, window_s: float = DEFAULT_WINDOW_S) -> str | None:
    """None when ``header`` signs this request to ``agent_id`` within ``window_s`` of ``now``; else why not."""
    checked = accepted(header, key, agent_id, method, path, request_id, body, now, window_s)
    return checked if isinstance(checked, str) else None


def accepted(header: str | None, key: str, agent_id: str, method: str, path: str, request_id: str, body: bytes,
             now: float | None = None, window_s: float = DEFAULT_WINDOW_S) -> Signed | str:
    """The signature when ``header`` signs this request to the instance ``agent_id`` within
    ``window_s`` of ``now`` (its nonce is for the caller's replay check); else why not."""
    if not header:
        return f"missing {SIGNATURE_HEADER}: calls must come through the router"
    parsed = parse(header)
    if parsed is None and header.startswith("v1,"):
        return f"{SIGNATURE_HEADER} v1 is refused: it does not name the instance; the router must sign {VERSION}"
    if parsed is None:
        return f"malformed {SIGNATURE_HEADER} (expected {VERSION},t=<unix seconds>,n=<24 hex>,s=<64 hex>)"
    timestamp, nonce, presented = parsed
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > window_s:
        when = f"{age:.0f} s ago" if age > 0 else f"{-age:.0f} s in the future"
        return f"stale signature: signed {when}, outside ±{window_s:.0f} s (check both hosts' clocks)"
    expected = signature(key, timestamp, nonce, agent_id, method, path, request_id, body)
    if not hmac.compare_digest(expected, presented.lower()):
        return ("signature does not match this request (wrong key, signed for another instance, or method, path, "
                "request id or body changed)")
    return parsed

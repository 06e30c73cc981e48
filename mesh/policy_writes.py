"""Conditional policy writes: the writer names the policy it based its change on, and the registry refuses
the write when the stored policy is another by then, so a change made meanwhile is never overwritten unseen.

A router rolling a canary back holds the policy its feed brought, which may be milliseconds older than an
operator's edit; written whole, it would undo the edit. Over HTTP the name is the policy's digest, sent as
``If-Match`` (``GET /policies/{capability}`` answers it as the ``ETag``); a refusal is 409 ``policy_changed``
carrying the policy stored now, for the writer to make its change again on that one.
"""

from __future__ import annotations

import hashlib

import msgspec

from mesh.policy import Policy


def policy_digest(policy: Policy) -> str:
    """The same for equal policies however they travelled (msgpack in the store, JSON on the feed): a digest
    of the decoded policy's own encoding, never of the bytes it arrived in."""
    return hashlib.sha256(msgspec.msgpack.encode(policy)).hexdigest()[:32]


def policy_etag(policy: Policy) -> str:
    """The policy's digest as an HTTP ETag (quoted): what ``If-Match`` sends back unchanged."""
    return f'"{policy_digest(policy)}"'


class PolicyChanged(Exception):
    """The stored policy is no longer the one the write was based on; ``current`` is it (None: deleted)."""

    def __init__(self, capability: str, current: Policy | None):
        super().__init__(f"The policy of {capability!r} changed since the version this write was based on; "
                         "read it again and make the change on it")
        self.capability = capability
        self.current = current

"""Conditional policy writes: the writer names the policy it based its change on, and the registry refuses
the write when the stored policy is another by then, so a change made meanwhile is never overwritten unseen.

A router rolling a canary back holds the policy its feed brought, which may be milliseconds older than an
operator's edit; written whole, it would undo the edit. Over HTTP the name is the policy's digest, sent as
``If-Match`` (``GET /policies/{capability}`` answers it as the ``ETag``); a refusal is 409 ``policy_changed``
carrying the policy stored now, for the writer to make its change again on that one. As in RFC 9110, ``If-Match: *``
writes over any stored policy (none stored: refused), and ``If-None-Match: *`` creates one only where none is stored
(409 ``policy_exists`` otherwise): an editor creating a policy never overwrites one created meanwhile.
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


# ``based_on`` for ``If-Match: *``: whatever policy is stored (a digest is hex digits, never this).
ANY_POLICY = "*"


class PolicyChanged(Exception):
    """The stored policy is no longer the one the write was based on; ``current`` is it (None: deleted). ``exists``:
    the write was to create the policy (``If-None-Match: *``) and one is stored."""

    def __init__(self, capability: str, current: Policy | None, *, exists: bool = False):
        super().__init__(f"A policy of {capability!r} is stored already (created meanwhile); read it and make the "
                         "change on it" if exists else
                         f"The policy of {capability!r} changed since the version this write was based on; "
                         "read it again and make the change on it")
        self.capability = capability
        self.current = current
        self.exists = exists


def check_write(capability: str, current: Policy | None, based_on: str | None, absent: bool) -> None:
    """Raise PolicyChanged when a write based on ``based_on`` (a digest, ANY_POLICY, None: on nothing in particular)
    and, with ``absent``, made to create the policy, may not go over ``current`` (None: nothing stored)."""
    if absent and current is not None:
        raise PolicyChanged(capability, current, exists=True)
    if based_on is not None and (current is None or based_on not in (ANY_POLICY, policy_digest(current))):
        raise PolicyChanged(capability, current)

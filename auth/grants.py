"""Pure decisions about what a credential may call."""

from __future__ import annotations

from collections.abc import Iterable

from agent_reach.registration import TrustLevel

# A credential of a level may call capabilities that require that level or a lower one.
TRUST_RANK: dict[str, int] = {"public": 0, "user_authorized": 1, "internal": 2}
# What a capability requires when its registration does not say: the safest level.
DEFAULT_REQUIRED_TRUST: TrustLevel = "internal"


class GrantSet:
    """A credential's grants compiled once, when the credential is resolved: exact names in a set and
    prefix grants (`order.*`) as one tuple, so a call's check is a set lookup and one ``startswith``."""

    __slots__ = ("_exact", "_prefixes")

    def __init__(self, grants: list[str]):
        self._exact = frozenset(grant for grant in grants if not grant.endswith(".*"))
        self._prefixes = tuple(grant[:-1] for grant in grants if grant.endswith(".*"))

    def covers(self, capability: str) -> bool:
        return capability in self._exact or capability.startswith(self._prefixes)


def granted(grants: list[str], capability: str) -> bool:
    """Whether an exact grant or an explicit prefix grant (`order.*`) covers ``capability``."""
    return GrantSet(grants).covers(capability)


def trust_allows(held: str, required: str | None) -> bool:
    return TRUST_RANK[held] >= TRUST_RANK[required or DEFAULT_REQUIRED_TRUST]


def strictest(required: Iterable[TrustLevel | None]) -> TrustLevel:
    """The level a caller needs to call every one of the instances requiring ``required``
    (a capability's instances may differ: a call may reach any of them)."""
    return max((level or DEFAULT_REQUIRED_TRUST for level in required), key=TRUST_RANK.__getitem__,
               default=DEFAULT_REQUIRED_TRUST)


def covered(grants: list[str], requested: str) -> bool:
    """Whether a requested scope item (a name or a prefix) lies within the grants."""
    if requested.endswith(".*"):
        prefix = requested[:-1]
        return any(grant.endswith(".*") and prefix.startswith(grant[:-1]) for grant in grants)
    return granted(grants, requested)


def narrow(grants: list[str], scope: str | None) -> list[str] | str:
    """The grants a token asks for (OAuth2 ``scope``, space separated); all of them when absent.

    Returns the narrowed list, or the first requested item the grants do not cover.
    """
    if scope is None or not scope.strip():
        return list(grants)
    requested = list(dict.fromkeys(scope.split()))
    for item in requested:
        if not covered(grants, item):
            return item
    return requested

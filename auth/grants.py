"""Pure decisions about what a credential may call."""

from __future__ import annotations

from agent_reach.registration import TrustLevel

# A credential of a level may call capabilities that require that level or a lower one.
TRUST_RANK: dict[str, int] = {"public": 0, "user_authorized": 1, "internal": 2}
# What a capability requires when its registration does not say: the safest level.
DEFAULT_REQUIRED_TRUST: TrustLevel = "internal"


def granted(grants: list[str], capability: str) -> bool:
    """Whether an exact grant or an explicit prefix grant (`order.*`) covers ``capability``."""
    for grant in grants:
        if grant.endswith(".*"):
            if capability.startswith(grant[:-1]):
                return True
        elif grant == capability:
            return True
    return False


def trust_allows(held: str, required: str | None) -> bool:
    return TRUST_RANK[held] >= TRUST_RANK[required or DEFAULT_REQUIRED_TRUST]


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

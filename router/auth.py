"""Who is calling: an API key or one of this router's JWTs resolved to a Caller, and what it may call.

Both paths are cached so the hot path costs a dict lookup: an API key by the client record it
resolved to (the mirror replaces a record on every change, so an identity check notices a disable
or a rotation), a JWT by its string until it expires (signature checks cost ~80 µs each).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

import msgspec
from agent_reach.atp import ErrorCode
from agent_reach.registration import TrustLevel

from auth.grants import GrantSet, trust_allows
from auth.headers import api_key, bearer, presented_key
from auth.records import ClientRecord
from router.mirror import RegistryMirror
from router.oauth import TokenClaims, TokenIssuer
from router.plan import CallPlan

# Verified credentials remembered; past this the oldest is forgotten (and verified again if it returns).
MAX_CACHED = 10_000
_V = TypeVar("_V")
_HOW = "send an API key as X-API-Key, or an access token from POST /oauth/token as Authorization: Bearer"


class Caller(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """A resolved credential. For a JWT, ``grants`` are the token's (perhaps narrowed by scope)."""

    client_id: str
    name: str
    trust_level: TrustLevel
    grants: list[str]
    via: Literal["api_key", "jwt"]
    rate_limit_qps: float  # 0 = unlimited
    grant_set: GrantSet  # ``grants`` compiled, once per credential: what a call checks


class Unauthenticated(msgspec.Struct, kw_only=True, frozen=True):
    """No usable credential; ``client_id`` when the credential named a client (a disabled one, say)."""

    message: str
    client_id: str | None = None


class Refusal(msgspec.Struct, kw_only=True, frozen=True):
    """Why a call does not go on: the error code to answer and the `decisions` counter to bump."""

    code: ErrorCode
    message: str
    decision: str
    retry_after: int | None = None
    # When a spent budget resets (ISO 8601, UTC), for BUDGET_EXHAUSTED.
    reset_at: str | None = None


class AdminRefusal(msgspec.Struct, kw_only=True, frozen=True):
    status: int
    error: str
    message: str


class _CachedToken(msgspec.Struct, gc=False):
    record: ClientRecord
    caller: Caller
    claims: TokenClaims


class Authenticator:
    def __init__(self, mirror: RegistryMirror, issuer: TokenIssuer, default_qps: float,
                 wall_clock: Callable[[], float] = time.time):
        self.mirror = mirror
        self.issuer = issuer
        self.default_qps = default_qps
        self._wall_clock = wall_clock
        self._api_keys: dict[str, tuple[ClientRecord, Caller]] = {}
        self._tokens: dict[str, _CachedToken] = {}

    def authenticate(self, headers: Mapping[str, str]) -> Caller | Unauthenticated:
        key = api_key(headers)
        if key is not None:
            return self._by_api_key(key)
        token = bearer(headers)
        if token is not None:
            return self._by_token(token)
        return Unauthenticated(message=f"This call needs a credential: {_HOW}")

    def _by_api_key(self, api_key: str) -> Caller | Unauthenticated:
        clients = self.mirror.auth.clients
        cached = self._api_keys.get(api_key)
        if cached is not None and clients.get(cached[0].client_id) is cached[0]:
            return cached[1]
        record = self.mirror.auth.client_by_api_key(api_key)
        if record is None:
            self._api_keys.pop(api_key, None)
            return Unauthenticated(message=f"Unknown, rotated or disabled API key; {_HOW}")
        caller = self._caller(record, record.grants, "api_key")
        _remember(self._api_keys, api_key, (record, caller))
        return caller

    def _by_token(self, token: str) -> Caller | Unauthenticated:
        cached = self._tokens.get(token)
        if cached is None:
            claims = self.issuer.verify(token)
            if isinstance(claims, str):
                return Unauthenticated(message=f"{claims}; {_HOW}")
            fresh = self._from_claims(token, claims)
            if isinstance(fresh, Unauthenticated):
                return fresh
            cached = fresh
        elif self._wall_clock() > cached.claims.exp + self.issuer.leeway:
            del self._tokens[token]
            return Unauthenticated(message=f"The token has expired; {_HOW}")
        record = self.mirror.auth.clients.get(cached.claims.sub)
        if record is not cached.record:
            self._tokens.pop(token, None)
            fresh = self._from_claims(token, cached.claims)
            if isinstance(fresh, Unauthenticated):
                return fresh
            cached = fresh
        return cached.caller

    def _from_claims(self, token: str, claims: TokenClaims) -> _CachedToken | Unauthenticated:
        """A verified token still needs its client: present, enabled, and not rotated since it was issued."""
        record = self.mirror.auth.clients.get(claims.sub)
        if record is None or not record.enabled:
            return Unauthenticated(message="The token's client is unknown or disabled", client_id=claims.sub)
        if record.rotated_at is not None and claims.iat < int(record.rotated_at):
            return Unauthenticated(message="The token was issued before its client's credentials were rotated",
                                   client_id=claims.sub)
        cached = _CachedToken(record=record, caller=self._caller(record, claims.grants, "jwt", claims.trust_level),
                              claims=claims)
        _remember(self._tokens, token, cached)
        return cached

    def _caller(self, record: ClientRecord, grants: list[str], via: Literal["api_key", "jwt"],
                trust_level: TrustLevel | None = None) -> Caller:
        rate = record.rate_limit_qps if record.rate_limit_qps is not None else self.default_qps
        return Caller(client_id=record.client_id, name=record.name, trust_level=trust_level or record.trust_level,
                      grants=grants, via=via, rate_limit_qps=rate, grant_set=GrantSet(grants))

    def admin_refusal(self, headers: Mapping[str, str]) -> AdminRefusal | None:
        """None when the request carries the admin key (X-API-Key or Bearer); else the 401/403 to answer."""
        key = presented_key(headers)
        if key is None:
            return AdminRefusal(status=401, error="unauthenticated",
                                message="This endpoint needs the admin key; send it as X-API-Key or "
                                        "Authorization: Bearer")
        if self.mirror.auth.is_admin(key):
            return None
        if isinstance(self.authenticate(headers), Caller):
            return AdminRefusal(status=403, error="forbidden",
                                message="This endpoint needs the admin key; the credential sent is a client's")
        return AdminRefusal(status=401, error="unauthenticated", message="The credential sent is not valid")


def authorize(caller: Caller, capability: str, plan: CallPlan | None) -> Refusal | None:
    """Grant first (so a refused caller learns nothing about the capability), then the trust level its
    instances require (``plan`` None: none offers it, so none is required yet)."""
    if not caller.grant_set.covers(capability):
        return Refusal(code=ErrorCode.FORBIDDEN, decision="forbidden",
                       message=f"Client {caller.client_id} is not granted {capability!r}")
    if plan is not None and not trust_allows(caller.trust_level, plan.required_trust):
        return Refusal(code=ErrorCode.TRUST_LEVEL_INSUFFICIENT, decision="trust_level_insufficient",
                       message=f"{capability!r} requires trust level {plan.required_trust}; "
                               f"client {caller.client_id} holds {caller.trust_level}")
    return None


def may_call(caller: Caller | Unauthenticated | None, plan: CallPlan | None) -> bool:
    """Whether a catalog (A2A cards, MCP tools) shows a capability to ``caller``: offered, and authorized
    when authentication is on (a refused credential is turned away before any catalog is read)."""
    return plan is not None and (not isinstance(caller, Caller) or authorize(caller, plan.capability, plan) is None)


def _remember(cache: dict[str, _V], key: str, value: _V) -> None:
    if len(cache) >= MAX_CACHED:
        del cache[next(iter(cache))]
    cache[key] = value

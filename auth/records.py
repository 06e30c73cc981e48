"""What the registry stores about who may do what: callers, agent registration tokens, the admin key.

Only digests of secrets are stored (and carried over the watch feed to routers); the secrets
themselves are shown once, when created. The one key a router needs in the clear, a token's
call-signing key, is stored sealed (auth.sealing) and opened for the admin-only watch feed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from agent_reach.registration import Name, TrustLevel
from agent_reach.usage import MAX_COST

CLIENT_PREFIX = "clients/"
TOKEN_PREFIX = "tokens/"
ADMIN_KEY = "settings/admin"
PUBLISHED_KEY_PREFIX = "signing-keys/"

# An exact capability name, or an explicit prefix ending in ".*" (`order.*`); never a bare "*".
GRANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*(\.\*)?\Z"
Grant = Annotated[str, msgspec.Meta(min_length=1, max_length=130, pattern=GRANT_PATTERN)]
Grants = Annotated[list[Grant], msgspec.Meta(min_length=1, max_length=256)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# A client's budget: tokens and/or cost (the routers' unit-free prices) per calendar period, UTC.
BudgetPeriod = Literal["hour", "day", "month"]
BudgetTokens = Annotated[int, msgspec.Meta(ge=1, le=2**53 - 1)]
BudgetCost = Annotated[float, msgspec.Meta(gt=0, le=MAX_COST)]


class ClientRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A caller of the mesh. Its secret and API key are stored as SHA-256 digests only."""

    client_id: str
    name: str
    trust_level: TrustLevel
    grants: list[str]
    secret_digest: str
    api_key_digest: str
    created_at: float
    enabled: bool = True
    rotated_at: float | None = None
    # Calls per second this client may make through one router; None means the router's default.
    rate_limit_qps: float | None = None
    # What the client may spend per period across every router (router/budgets.py); None: no such budget.
    budget_tokens: int | None = None
    budget_cost: float | None = None
    budget_period: BudgetPeriod | None = None


class TokenRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An agent registration token, bound to one service.

    The signing key is derived from the token (``agent_reach.signing.signing_key``): the router signs
    what it forwards to the service's instances with it, and the agent, holding the token, can
    derive it too and verify. Knowing it lets one sign calls to that service, not register, so it
    is never at rest in the clear: the log holds it sealed under the data dir's secrets.key
    (``sealed_key``, bound to ``token_id``), and the registry opens it only for the watch feed,
    whose followers (routers) get it in the clear (``signing_key``) and keep it in memory.
    A stored record with ``signing_key`` was written before sealing; the registry reseals it at start.
    """

    token_id: str
    service: str
    token_digest: str
    created_at: float
    revoked: bool = False
    sealed_key: str | None = None
    signing_key: str | None = None


Kid = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,16}-[0-9a-f]{1,32}\Z")]
# An Ed25519 public key: 32 bytes, base64url without padding (a JWK's `x`).
PublicX = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{43}\Z")]


class PublishedKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A router's token-verifying public key, published through the registry so that every router
    accepts every router's tokens. ``verify_until`` is set once a newer key replaced it: tokens it
    signed have all expired by then."""

    kid: Kid
    x: PublicX
    verify_until: float | None = None


class AdminRecord(msgspec.Struct, kw_only=True):
    key_digest: str
    created_at: float


# The credentials' keys and the record each holds: the mesh's store and watch feed decode by them (mesh/records.py).
AUTH_RECORD_TYPES: list[tuple[str, type]] = [
    (CLIENT_PREFIX, ClientRecord), (TOKEN_PREFIX, TokenRecord), (ADMIN_KEY, AdminRecord),
    (PUBLISHED_KEY_PREFIX, PublishedKey),
]


class ClientCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /clients."""

    name: Label
    trust_level: TrustLevel
    grants: Grants
    rate_limit_qps: Annotated[float, msgspec.Meta(gt=0)] | None = None
    budget_tokens: BudgetTokens | None = None
    budget_cost: BudgetCost | None = None
    budget_period: BudgetPeriod | None = None


class ClientBudget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of PUT /clients/{id}/budget: the client's whole budget (none given: no budget)."""

    budget_tokens: BudgetTokens | None = None
    budget_cost: BudgetCost | None = None
    budget_period: BudgetPeriod | None = None


class TokenCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /tokens."""

    service: Name


class ClientView(msgspec.Struct, kw_only=True):
    """A client as the admin API shows it: never a digest."""

    client_id: str
    name: str
    trust_level: TrustLevel
    grants: list[str]
    enabled: bool
    created_at: float
    rotated_at: float | None = None
    rate_limit_qps: float | None = None
    budget_tokens: int | None = None
    budget_cost: float | None = None
    budget_period: BudgetPeriod | None = None


class ClientSecrets(msgspec.Struct, kw_only=True):
    """The answer to creating or rotating a client: the only time its secrets are shown."""

    client_id: str
    client_secret: str
    api_key: str
    name: str
    trust_level: TrustLevel
    grants: list[str]


class TokenView(msgspec.Struct, kw_only=True):
    token_id: str
    service: str
    created_at: float
    revoked: bool


class IssuedToken(msgspec.Struct, kw_only=True):
    """The answer to creating a registration token: the only time the token is shown."""

    token: str
    token_id: str
    service: str
    created_at: float


def client_key(client_id: str) -> str:
    return CLIENT_PREFIX + client_id


def token_key(token_id: str) -> str:
    return TOKEN_PREFIX + token_id


def published_key_key(kid: str) -> str:
    return PUBLISHED_KEY_PREFIX + kid


def client_view(record: ClientRecord) -> ClientView:
    return ClientView(client_id=record.client_id, name=record.name, trust_level=record.trust_level,
                      grants=record.grants, enabled=record.enabled, created_at=record.created_at,
                      rotated_at=record.rotated_at, rate_limit_qps=record.rate_limit_qps,
                      budget_tokens=record.budget_tokens, budget_cost=record.budget_cost,
                      budget_period=record.budget_period)


def token_view(record: TokenRecord) -> TokenView:
    return TokenView(token_id=record.token_id, service=record.service, created_at=record.created_at,
                     revoked=record.revoked)

"""OAuth2 client credentials (RFC 6749 §4.4): issuing the router's JWT access tokens and verifying them.

Tokens are signed with the key ring's current Ed25519 key (`alg: Ed25519`, RFC 9864) and verified
with Ed25519 only — under that name or the deprecated `EdDSA` that older routers wrote — so
`alg: none` and HS256-with-the-public-key tokens never reach a verifier.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote_plus

import jwt
import msgspec
from agent_reach.registration import TrustLevel
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from jwt.algorithms import OKPAlgorithm
from multidict import MultiMapping

from auth.book import AuthBook
from auth.grants import narrow
from auth.records import ClientRecord, PublishedKey
from auth.secrets import matches
from router.keyring import ACCEPTED_ALGORITHMS, ALGORITHM, KeyRing, from_x, jwk

AUDIENCE = "agentreach"
GRANT_TYPE = "client_credentials"
REQUIRED_CLAIMS = ["sub", "aud", "iss", "exp", "iat", "nbf", "jti"]
SINGLE_VALUED = ("grant_type", "scope", "client_id", "client_secret")


def _name_ed25519() -> None:
    """pyjwt (2.x) knows Ed25519 signatures only by the name ``EdDSA``; teach it RFC 9864's name for
    the same algorithm, unless a newer pyjwt already knows it."""
    try:
        jwt.get_algorithm_by_name(ALGORITHM)
    except NotImplementedError:
        jwt.register_algorithm(ALGORITHM, OKPAlgorithm())


_name_ed25519()


class TokenClaims(msgspec.Struct, kw_only=True):
    """The claims of a token this router issued, once its signature and times have been checked."""

    sub: str
    exp: float
    iat: float
    trust_level: TrustLevel
    grants: list[str]


class TokenAnswer(msgspec.Struct, kw_only=True):
    """A successful token response (RFC 6749 §5.1)."""

    access_token: str
    token_type: str = "Bearer"
    expires_in: int
    scope: str


class OAuthRefusal(msgspec.Struct, kw_only=True):
    """An error response (RFC 6749 §5.2); ``field`` names the parameter at fault, as our other errors do."""

    error: str
    error_description: str
    field: str | None = None
    status: int = 400
    # Whether the client tried HTTP Basic: its 401 then carries `WWW-Authenticate: Basic`.
    basic: bool = False

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "error_description": self.error_description, "field": self.field}


class Credentials(msgspec.Struct, frozen=True):
    client_id: str
    client_secret: str
    basic: bool


class TokenIssuer:
    """Issues tokens with this router's keys; accepts those signed by this router's keys or by any
    key another router published through the registry (``published``), so callers may use any router."""

    def __init__(self, keys: KeyRing, issuer: str, ttl: int, leeway: float,
                 published: Callable[[], Mapping[str, PublishedKey]] = dict,
                 wall_clock: Callable[[], float] = time.time):
        self.keys = keys
        self.issuer = issuer
        self.ttl = ttl
        self.leeway = leeway
        self._published = published
        self._wall_clock = wall_clock
        self._decoded: dict[str, tuple[str, Ed25519PublicKey]] = {}

    def verifying(self, kid: str) -> Ed25519PublicKey | None:
        """The public key for ``kid``: this router's own, else a published one still within its time."""
        own = self.keys.verifying(kid)
        if own is not None:
            return own
        record = self._published().get(kid)
        if record is None or (record.verify_until is not None and self._wall_clock() > record.verify_until):
            return None
        decoded = self._decoded.get(kid)
        if decoded is None or decoded[0] != record.x:
            decoded = self._decoded[kid] = (record.x, from_x(record.x))
        return decoded[1]

    def jwks(self) -> dict[str, Any]:
        """Every key that verifies tokens now, this router's and the published ones, as a JWK set (RFC 7517)."""
        now = self._wall_clock()
        keys = {**self._published(), **{key.kid: key for key in self.keys.published()}}
        return {"keys": [jwk(key.kid, key.x) for key in keys.values()
                         if key.verify_until is None or now <= key.verify_until]}

    def issue(self, client: ClientRecord, grants: list[str]) -> TokenAnswer:
        now = int(self._wall_clock())
        key = self.keys.current
        claims = {"sub": client.client_id, "aud": AUDIENCE, "iss": self.issuer, "iat": now, "nbf": now,
                  "exp": now + self.ttl, "jti": secrets.token_hex(16), "trust_level": client.trust_level,
                  "grants": grants}
        token = jwt.encode(claims, key.private, algorithm=ALGORITHM, headers={"kid": key.kid})
        return TokenAnswer(access_token=token, expires_in=self.ttl, scope=" ".join(grants))

    def verify(self, token: str) -> TokenClaims | str:
        """The token's claims, or why it is refused."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return "The bearer token is not a JWT"
        if header.get("alg") not in ACCEPTED_ALGORITHMS:
            return f"Tokens must be signed with {ALGORITHM}"
        kid = header.get("kid")
        key = self.verifying(kid) if isinstance(kid, str) else None
        if key is None:
            return "The token's signing key is unknown or retired"
        try:
            claims = jwt.decode(token, key, algorithms=list(ACCEPTED_ALGORITHMS), audience=AUDIENCE, issuer=self.issuer,
                                leeway=self.leeway, options={"require": REQUIRED_CLAIMS})
            return msgspec.convert(claims, TokenClaims)
        except jwt.ExpiredSignatureError:
            return "The token has expired"
        except jwt.InvalidTokenError as exc:
            return f"The token is not valid: {exc}"
        except msgspec.ValidationError as exc:
            return f"The token's claims are not this router's: {exc}"

    def grant(self, form: MultiMapping[str], authorization: str | None, book: AuthBook) -> TokenAnswer | OAuthRefusal:
        """Answer a token request: the grant type, the client's authentication, then the scope."""
        for name in SINGLE_VALUED:
            if len(form.getall(name, [])) > 1:
                return OAuthRefusal(error="invalid_request", error_description=f"{name} is repeated", field=name)
        grant_type = form.get("grant_type")
        if grant_type is None:
            return OAuthRefusal(error="invalid_request", error_description="grant_type is required",
                                field="grant_type")
        if grant_type != GRANT_TYPE:
            return OAuthRefusal(error="unsupported_grant_type", field="grant_type",
                                error_description=f"Only grant_type={GRANT_TYPE} is supported")
        credentials = client_credentials(form, authorization)
        if isinstance(credentials, OAuthRefusal):
            return credentials
        client = book.clients.get(credentials.client_id)
        if client is None or not client.enabled or not matches(credentials.client_secret, client.secret_digest):
            return OAuthRefusal(error="invalid_client", status=401, basic=credentials.basic, field="client_id",
                                error_description="Unknown client, wrong secret or disabled client")
        grants = narrow(client.grants, form.get("scope"))
        if isinstance(grants, str):
            return OAuthRefusal(error="invalid_scope", field="scope",
                                error_description=f"{grants!r} is not within the client's grants")
        return self.issue(client, grants)


def client_credentials(form: Mapping[str, str], authorization: str | None) -> Credentials | OAuthRefusal:
    """The client's id and secret from HTTP Basic or the form (RFC 6749 §2.3.1), never both."""
    in_form = "client_secret" in form
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() == "basic":
        if in_form:
            return OAuthRefusal(error="invalid_request", field="client_secret",
                                error_description="Authenticate the client one way: HTTP Basic or form fields")
        try:
            client_id, colon, secret = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except ValueError:  # not base64 (binascii.Error), not UTF-8, or not ASCII at all
            client_id = colon = secret = ""
        if not colon:
            return OAuthRefusal(error="invalid_client", status=401, basic=True, field="Authorization",
                                error_description="HTTP Basic credentials are not base64 of client_id:client_secret")
        return Credentials(unquote_plus(client_id), unquote_plus(secret), basic=True)
    if in_form and "client_id" in form:
        return Credentials(form["client_id"], form["client_secret"], basic=False)
    return OAuthRefusal(error="invalid_client", status=401, field="client_id",
                        error_description="Client authentication is required: HTTP Basic, or client_id and "
                                          "client_secret form fields")

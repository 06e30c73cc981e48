"""Making and checking secrets.

Every secret is 32 random bytes, so a plain SHA-256 digest is enough to store it: there is nothing
to brute-force, and a slow password hash would cost every API-key call milliseconds. The prefixes
(`ark_`, `art_`, …) let secret scanners recognise a leaked key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

API_KEY_PREFIX = "ark_"
CLIENT_SECRET_PREFIX = "arc_"
REGISTRATION_TOKEN_PREFIX = "art_"
ADMIN_KEY_PREFIX = "ara_"


def new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)

"""The router's token signing keys (Ed25519), by kid: one current key signs, older ones only verify.

A key's id carries its creation time (``<unix milliseconds>-<random>``), so the ring needs no index file:
a key stops signing when a newer one is created, and is dropped once every token it signed has
expired (the successor's creation + token ttl + leeway). With ``keys_dir`` the keys are PEM files
(mode 0600) that survive restarts; without it they live in memory and tokens die with the router.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auth.records import PublishedKey
from wal.private import write_private

log = logging.getLogger("agentreach.router.keys")

# The JOSE name of Ed25519 signatures (RFC 9864), in every token and JWK this router issues.
ALGORITHM = "Ed25519"
# Verified too: RFC 8037's polymorphic name, now deprecated, in tokens from routers before RFC 9864.
ACCEPTED_ALGORITHMS = (ALGORITHM, "EdDSA")
PEM_SUFFIX = ".pem"


class SigningKey(msgspec.Struct, frozen=True):
    kid: str
    created_at: float
    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()


def public_x(key: Ed25519PublicKey) -> str:
    """The key as a JWK's `x`: its 32 raw bytes, base64url without padding."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def from_x(x: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(x + "="))


def jwk(kid: str, x: str) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": ALGORITHM, "use": "sig"}


class KeyRingError(Exception):
    """A key file that cannot be used; the router refuses to start rather than sign with a guess."""


def new_kid(created_at: float) -> str:
    return f"{int(created_at * 1000)}-{secrets.token_hex(4)}"


def kid_created_at(kid: str) -> float | None:
    millis, _, rest = kid.partition("-")
    return int(millis) / 1000 if millis.isdigit() and rest else None


def retained_until(successor_created_at: float, ttl: float, leeway: float) -> float:
    """When a replaced key's last token has expired: it was issued at most at the successor's birth."""
    return successor_created_at + ttl + leeway


class KeyRing:
    def __init__(self, keys_dir: Path | None, ttl: float, leeway: float,
                 wall_clock: Callable[[], float] = time.time):
        self.keys_dir = keys_dir
        self.ttl = ttl
        self.leeway = leeway
        self._wall_clock = wall_clock
        self._keys: list[SigningKey] = []  # oldest first; the last one signs
        self._by_kid: dict[str, SigningKey] = {}

    def load(self) -> None:
        """Read the key files (or start empty in memory), drop expired ones, make sure one can sign."""
        if self.keys_dir is not None:
            loaded = [self._read(path) for path in sorted(self.keys_dir.glob(f"*{PEM_SUFFIX}"))]
            self._keys = sorted(loaded, key=lambda key: key.created_at)
            self._by_kid = {key.kid: key for key in self._keys}
        self.prune()
        if not self._keys:
            self.rotate()

    @property
    def current(self) -> SigningKey:
        return self._keys[-1]

    def rotate(self) -> SigningKey:
        """A new current key; the previous ones verify until their tokens have expired."""
        now = self._wall_clock()
        key = SigningKey(kid=new_kid(now), created_at=now, private=Ed25519PrivateKey.generate())
        if self.keys_dir is not None:
            self._write(key)
        self._keys.append(key)
        self._by_kid[key.kid] = key
        self.prune()
        log.info("new token signing key", extra={"kid": key.kid, "keys": len(self._keys)})
        return key

    def verifying(self, kid: str) -> Ed25519PublicKey | None:
        """The public key for ``kid`` while tokens it signed may still be valid; None otherwise."""
        key = self._by_kid.get(kid)
        if key is None or not self._usable(self._keys.index(key), self._wall_clock()):
            return None
        return key.public

    def published(self) -> list[PublishedKey]:
        """This ring's verifying keys as the registry publishes them to every router: the current
        one open-ended, each older one until its last token has expired."""
        return [PublishedKey(kid=key.kid, x=public_x(key.public),
                             verify_until=None if index == len(self._keys) - 1 else
                             retained_until(self._keys[index + 1].created_at, self.ttl, self.leeway))
                for index, key in enumerate(self._keys)]

    def prune(self) -> None:
        """Forget (and delete the files of) keys whose every token has expired."""
        now = self._wall_clock()
        dead = [key for index, key in enumerate(self._keys) if not self._usable(index, now)]
        for key in dead:
            self._keys.remove(key)
            del self._by_kid[key.kid]
            if self.keys_dir is not None:
                (self.keys_dir / f"{key.kid}{PEM_SUFFIX}").unlink(missing_ok=True)
            log.info("token signing key dropped", extra={"kid": key.kid})

    def _usable(self, index: int, now: float) -> bool:
        if index == len(self._keys) - 1:
            return True
        return now <= retained_until(self._keys[index + 1].created_at, self.ttl, self.leeway)

    def _read(self, path: Path) -> SigningKey:
        kid = path.name[:-len(PEM_SUFFIX)]
        created_at = kid_created_at(kid)
        if created_at is None:
            raise KeyRingError(f"{path}: a key file is named <unix milliseconds>-<id>.pem")
        if path.stat().st_mode & 0o077:
            raise KeyRingError(f"{path}: a signing key must be readable by its owner only (chmod 600)")
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise KeyRingError(f"{path}: not an Ed25519 private key")
        return SigningKey(kid=kid, created_at=created_at, private=private)

    def _write(self, key: SigningKey) -> None:
        assert self.keys_dir is not None
        pem = key.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
        write_private(self.keys_dir / f"{key.kid}{PEM_SUFFIX}", pem, replace=False)

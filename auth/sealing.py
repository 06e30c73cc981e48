"""Sealing a secret for storage: AES-256-GCM under a key-encryption key that never enters the log.

A registration token's call-signing key lets whoever holds it sign calls to that service, so the
log and its snapshots keep it sealed only; the key that opens it lives in a 0600 file beside them
(auth.kek). The additional data names the record a sealed value belongs to, so a sealed value
copied into another record does not open there. Pure functions: no randomness unless ``nonce`` is
left out.

    sealed = base64url(nonce (12 bytes) || ciphertext || tag (16 bytes)), no padding
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEK_BYTES = 32
NONCE_BYTES = 12
_PURPOSE = "agentreach sealed signing key v1"


class SealError(Exception):
    """A sealed value that does not open: another key-encryption key, another record, or damaged."""


def _bound_to(record_id: str) -> bytes:
    return f"{_PURPOSE}\n{record_id}".encode()


def seal(kek: bytes, record_id: str, secret: str, nonce: bytes | None = None) -> str:
    """``secret`` sealed under ``kek`` for the record ``record_id`` only."""
    nonce = nonce or os.urandom(NONCE_BYTES)
    sealed = nonce + AESGCM(kek).encrypt(nonce, secret.encode(), _bound_to(record_id))
    return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()


def unseal(kek: bytes, record_id: str, sealed: str) -> str:
    """The secret ``seal`` sealed for ``record_id``; SealError if it does not open."""
    try:
        raw = base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))
        return AESGCM(kek).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _bound_to(record_id)).decode()
    except (InvalidTag, ValueError) as exc:
        raise SealError(f"the sealed signing key of {record_id!r} does not open with this key-encryption key "
                        "(another secrets.key, or copied from another record)") from exc

"""The data dir's key-encryption key (``secrets.key``): what opens the signing keys sealed in the log.

Created on first start (32 random bytes as hex, mode 0600), refused when group or others may read
it: a readable key-encryption key would undo the sealing. Keep it with the data dir's backups —
without it the sealed keys do not open and the registry refuses to start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from auth.sealing import KEK_BYTES
from wal.private import write_private

log = logging.getLogger("agentreach.registry.secrets")

SECRETS_KEY_FILE = "secrets.key"


class SecretsKeyError(Exception):
    """A key-encryption key file that must not be used; the registry refuses to start."""


def load_kek(data_dir: Path) -> bytes:
    """The key in ``<data_dir>/secrets.key``, made on first start."""
    path = data_dir / SECRETS_KEY_FILE
    if not path.exists():
        write_private(path, os.urandom(KEK_BYTES).hex().encode() + b"\n", replace=False)
        log.warning("key-encryption key created", extra={"path": str(path)})
    if path.stat().st_mode & 0o077:
        raise SecretsKeyError(f"{path}: the key that opens the sealed signing keys must be readable by its owner "
                              "only (chmod 600)")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEK_BYTES:
        raise SecretsKeyError(f"{path}: expected {KEK_BYTES} bytes as {2 * KEK_BYTES} hex digits")
    return key

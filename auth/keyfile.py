"""Secret files in the data dir (admin.key, secrets.key): owner-only, and never seen half-written.

A secret is written aside (0600, fsynced), then moved into place and the directory fsynced, so a
crash leaves either the old file or the new one whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from wal.files import fsync_dir


def write_private(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``path`` whole, mode 0600. Without ``replace`` an existing file wins: FileExistsError."""
    staged = path.with_suffix(".new")
    staged.unlink(missing_ok=True)
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    if replace:
        os.replace(staged, path)
    else:
        try:
            os.link(staged, path)
        finally:
            staged.unlink()
    fsync_dir(path.parent)

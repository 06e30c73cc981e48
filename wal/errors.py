"""Exceptions raised by the write-ahead log.

Corruption gets its own type, carrying the file and byte offset, because the
operator has to go and look at that exact place: the log never skips damage.
"""

from __future__ import annotations

import os


class WalError(Exception):
    """The log cannot do what was asked (closed, failed, misused, locked)."""


class WalCorruption(WalError):
    """Damage that is not a torn tail: replaying past it could lose or reorder records."""

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path} at byte offset {offset}: {reason}")


class WalUnavailable(WalError):
    """The disk refuses writes (full, read-only, failing): nothing was acknowledged, and the log
    repairs itself and takes appends again once the disk does."""

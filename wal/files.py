"""Small durable-file helpers shared by segments and snapshots.

A rename or a new file is only durable once its directory is fsynced, and
os.write may write less than asked; both rules live here once.
"""

from __future__ import annotations

import fcntl
import os

from .errors import WalError

LOCK_NAME = "LOCK"


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make entries created, renamed or removed in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_files(directory: str | os.PathLike[str], paths: list[str]) -> None:
    """Delete `paths` (all inside `directory`) and make the deletions durable."""
    for path in paths:
        os.remove(path)
    if paths:
        fsync_dir(directory)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of `data`, looping over short writes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def ensure_directory(directory: str | os.PathLike[str]) -> None:
    """Create `directory` (and parents) durably if it does not exist yet."""
    path = os.path.abspath(directory)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    ensure_directory(parent)
    os.mkdir(path)
    fsync_dir(parent)


def lock_directory(directory: str | os.PathLike[str]) -> int:
    """Take an exclusive lock so two processes never append to the same log."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WalError(f"{os.fspath(directory)} is already open (another WriteAheadLog holds its LOCK)") from None
    return fd

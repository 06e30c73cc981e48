"""Small durable-file helpers shared by segments and snapshots.

A rename or a new file is only durable once its directory is fsynced, and
os.write may write less than asked; both rules live here once.
"""

from __future__ import annotations

import os


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


def truncate_durably(path: str | os.PathLike[str], size: int) -> None:
    """Cut `path` back to `size` bytes through a fresh descriptor and make the new length durable."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)

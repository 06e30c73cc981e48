"""The data dir is private: directories 0700, files 0600, whatever the umask, and checked at start.

It holds the WAL, snapshots, audit.db, console.db, admin.key and signing keys: nothing in it is
for other local users. mkdir and os.open apply the umask to the mode they are given, so every
creation here sets the mode explicitly afterwards; every package creates its private files here
(wal is the lowest package: auth, registry, router and console all import it). A data dir made by
an older version or by hand may be looser; the start-up check warns once per kind of path, with
the chmod that fixes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

from .files import fsync_dir

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
LOOSE_BITS = 0o077

log = logging.getLogger("agentreach.storage")


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """os.open that creates `path` 0600 and leaves an existing file 0600 too."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Make `path` exist, 0600, before a library opens it: SQLite gives its -wal and -shm files
    the database file's mode, so a private database keeps its companions private."""
    private_dirs(os.path.dirname(os.path.abspath(path)))
    os.close(open_private(path, os.O_WRONLY))


def write_private(path: str | os.PathLike[str], data: bytes, *, replace: bool) -> None:
    """Write ``path`` whole, 0600, its missing directories 0700: never seen half-written (written
    aside and fsynced, then moved into place and the directory fsynced, so a crash leaves the old
    file or the new one whole). Without ``replace`` an existing file wins: FileExistsError."""
    path = os.path.abspath(path)
    staged = f"{path}.new"
    private_dirs(os.path.dirname(path))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staged)
    with os.fdopen(open_private(staged, os.O_WRONLY | os.O_EXCL), "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    if replace:
        os.replace(staged, path)
    else:
        try:
            os.link(staged, path)
        finally:
            os.unlink(staged)
    fsync_dir(os.path.dirname(path))


def private_dirs(directory: str | os.PathLike[str]) -> None:
    """Create `directory` and any missing parents, each 0700, each entry made durable."""
    path = os.path.abspath(directory)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    private_dirs(parent)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        return
    os.chmod(path, PRIVATE_DIR)
    fsync_dir(parent)


def path_class(data_dir: str, path: str, is_dir: bool) -> str:
    """The pattern a loose path is reported under, so a thousand segments make one warning.

    A directory is its own class; a file in a subdirectory belongs to `subdir/*`; a file at the
    top belongs to its name up to the first "-" plus "*" (audit.db, audit.db-wal, audit.db-shm).
    """
    if is_dir:
        return path
    parent, name = os.path.split(path)
    if parent != data_dir:
        return os.path.join(parent, "*")
    return os.path.join(parent, name.split("-", 1)[0] + "*")


def fix_for(pattern: str, is_dir: bool) -> str:
    return f"chmod {PRIVATE_DIR if is_dir else PRIVATE_FILE:o} {pattern}"


def loose_paths(data_dir: str | os.PathLike[str]) -> dict[tuple[str, bool], list[tuple[str, int]]]:
    """Every path in the data dir that group or others may use, by (class, is_dir): (path, mode)."""
    root = os.path.abspath(data_dir)
    found: dict[tuple[str, bool], list[tuple[str, int]]] = {}
    if not os.path.isdir(root):
        return found
    for directory, _dirs, files in os.walk(root):
        for path, is_dir in [(directory, True)] + [(os.path.join(directory, name), False) for name in files]:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(mode) or not mode & LOOSE_BITS:
                continue
            found.setdefault((path_class(root, path, is_dir), is_dir), []).append((path, stat.S_IMODE(mode)))
    return found


def warn_loose_modes(data_dir: str | os.PathLike[str]) -> list[str]:
    """Log one warning per class of path that is looser than 0700/0600; return the classes."""
    classes = loose_paths(data_dir)
    for (pattern, is_dir), paths in classes.items():
        modes = sorted({mode for _, mode in paths})
        fix = fix_for(pattern, is_dir)
        log.warning(
            "%s %s is open to other local users (mode %s): run `%s`",
            "directory" if is_dir else f"{len(paths)} file(s)",
            pattern,
            ", ".join(f"{mode:04o}" for mode in modes),
            fix,
            extra={"path": pattern, "paths": len(paths), "modes": [f"{mode:04o}" for mode in modes], "fix": fix},
        )
    return [pattern for pattern, _ in classes]

"""Bringing a data dir written before signing keys were sealed onto sealed keys, with no clear copy left.

Resealing rewrites each such token record, but the clear bytes stay in the older log segments and
snapshots until a snapshot covers the rewrites and compaction deletes those files. A marker file,
made before the first rewrite and removed once that snapshot is durable, lets a crash in between
finish the job at the next start.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from registry.access import Access
from registry.store import WalStore
from wal.files import fsync_dir
from wal.private import write_private

PENDING_FILE = "reseal.pending"


async def reseal(access: Access, store: WalStore, data_dir: Path) -> int:
    """Reseal clear signing keys and drop the files that held them; how many were resealed."""
    marker = data_dir / PENDING_FILE
    if not marker.exists():
        if not any(record.signing_key is not None for record in access.book.tokens.values()):
            return 0
        write_private(marker, b"", replace=True)
    resealed = await access.reseal_clear_keys()
    await store.wal.snapshot(store.revision, msgspec.msgpack.encode(store.snapshot()))
    marker.unlink()
    fsync_dir(data_dir)
    return resealed

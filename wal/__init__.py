"""Agent Reach's write-ahead log: the registry writes every change here first.

Modules, one job each (after etcd's server/storage/wal):
encoder (record framing), decoder (reading and verifying segments), repair
(torn tail vs corruption), segment (segment files), writer (the disk side of
appending), snapshot (snapshot files), replay (start-up recovery), log (the
WriteAheadLog with group commit), inspection (read-only report for the CLI).
"""

from .errors import WalCorruption, WalError
from .inspection import WalInspection, format_inspection, inspect_wal
from .log import WalStats, WriteAheadLog
from .repair import TailTruncation
from .replay import ReplayReport

__all__ = [
    "ReplayReport",
    "TailTruncation",
    "WalCorruption",
    "WalError",
    "WalInspection",
    "WalStats",
    "WriteAheadLog",
    "format_inspection",
    "inspect_wal",
]

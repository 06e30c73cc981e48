"""Agent Reach's write-ahead log: the registry writes every change here first.

Modules, one job each (after etcd's server/storage/wal):
encoder (record framing), decoder (reading and verifying segments), repair
(torn tail vs corruption), segment (segment files), writer (the disk side of
appending, and recovery after a failed write), snapshot (snapshot files),
replay (start-up recovery), log (the WriteAheadLog with group commit),
inspection (read-only report for the CLI), private (0700/0600 data dir).
"""

from .errors import WalCorruption, WalError, WalUnavailable
from .inspection import WalInspection, format_inspection, inspect_wal
from .log import WalHealth, WalStats, WriteAheadLog
from .repair import TailTruncation
from .replay import ReplayReport

__all__ = [
    "ReplayReport",
    "TailTruncation",
    "WalCorruption",
    "WalError",
    "WalHealth",
    "WalInspection",
    "WalStats",
    "WalUnavailable",
    "WriteAheadLog",
    "format_inspection",
    "inspect_wal",
]

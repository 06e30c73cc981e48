"""Record framing: how one record is laid out in a segment file.

    offset 0   u32  payload length
    offset 4   u32  CRC32 over bytes 8..(16 + length), i.e. index + payload
    offset 8   u64  record index (1, 2, 3, ... across segments and restarts)
    offset 16  payload, then zero padding to the next 8-byte boundary

Putting the index right before the payload lets one crc32 call cover both, and
8-byte alignment (as in etcd) keeps every header on an aligned offset, which
is what lets the decoder probe for valid records after a damaged one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

HEADER = struct.Struct("<IIQ")
HEADER_SIZE = HEADER.size
INDEX = struct.Struct("<Q")
ALIGNMENT = 8
MAX_PAYLOAD = 0xFFFFFFFF
_PADDING = [b"\0" * n for n in range(ALIGNMENT)]


def encode_batch(first_index: int, payloads: Sequence[bytes]) -> bytes:
    """Frame consecutive records starting at `first_index` into one buffer for a single write."""
    parts: list[bytes] = []
    pack = HEADER.pack
    pack_index = INDEX.pack
    crc32 = zlib.crc32
    for index, payload in enumerate(payloads, first_index):
        length = len(payload)
        crc = crc32(payload, crc32(pack_index(index)))
        parts.append(pack(length, crc, index))
        parts.append(payload)
        parts.append(_PADDING[-(HEADER_SIZE + length) % ALIGNMENT])
    return b"".join(parts)

"""OTLP/protobuf written directly: the router's spans as the bytes of an ExportTraceServiceRequest.

Building Python protobuf objects and serialising them (the SDK's ``encode_spans``) costs some 30 µs a span on
these machines, four times what the call itself costs the router to record; a routed call's spans are a few
hundred bytes of fixed layout, written here in a few µs. The field numbers are opentelemetry-proto's
(``trace.proto``, ``common.proto``, ``resource.proto``); tests/test_otlp_wire.py decodes what this writes
and compares it, message by message, with what the SDK's encoder writes for the same spans.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_DOUBLE = struct.Struct("<d")
_INT64 = (1 << 64) - 1  # a negative int64 is its 64-bit two's complement on the wire

# Span.kind (trace.proto's SpanKind) and Status.code (StatusCode).
SERVER, CLIENT = 2, 3
STATUS_ERROR = 2
# Span.flags: the SDK tells whether the parent is remote (SpanFlags' two masks).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


def _varint_of(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


# Lengths and small numbers, written once: a span's size, an attribute's, a port.
_SMALL = [_varint_of(number) for number in range(1 << 14)]


def _varint(number: int) -> bytes:
    return _SMALL[number] if number < 1 << 14 else _varint_of(number)


def _utf8(text: str) -> bytes:
    """A proto string is UTF-8: a lone surrogate (a header aiohttp decoded with surrogateescape) becomes '?'."""
    return text.encode("utf-8", "replace")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    size = len(payload)
    if number < 16 and size < 0x80:  # a one-byte tag and a one-byte length: most fields here
        return bytes((number << 3 | 2, size)) + payload
    return b"".join((_varint(number << 3 | 2), _varint(size), payload))


def _any_value(value: Any) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5 (an ArrayValue of AnyValues in its field 1)."""
    if isinstance(value, str):
        return _field(1, _utf8(value))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & _INT64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, _any_value(item)) for item in value))
    raise TypeError(f"an attribute value must be a str, bool, int, float or a sequence of them, not {type(value)}")


# Encoded attributes with a scalar value: nearly all repeat from call to call (capability, agent, address);
# the ones that do not (request ids) are why it is emptied, not evicted, when full.
_encoded: dict[tuple[int, str, type, Any], bytes] = {}
MAX_ENCODED = 65_536


def _attribute(number: int, key: str, value: Any) -> bytes:
    """A KeyValue (key 1, value 2: an AnyValue) as the field ``number`` of its message. The value's type is in
    the cache's key: True == 1 == 1.0 in Python, not on the wire."""
    if not isinstance(value, str | int | float):
        return _field(number, _field(1, _utf8(key)) + _field(2, _any_value(value)))
    cached = (number, key, type(value), value)
    encoded = _encoded.get(cached)
    if encoded is None:
        if len(_encoded) >= MAX_ENCODED:
            _encoded.clear()
        encoded = _encoded[cached] = _field(number, _field(1, _utf8(key)) + _field(2, _any_value(value)))
    return encoded


def attributes(number: int, values: Mapping[str, Any]) -> bytes:
    """Each attribute a KeyValue in the repeated field ``number`` of its message."""
    return b"".join([_attribute(number, key, value) for key, value in values.items()])


def span_attributes(values: Mapping[str, Any]) -> bytes:
    """A span's attributes (its field 9), encoded: blocks of them may be kept and joined."""
    return attributes(9, values)


def span_shape(name: str, kind: int, attributes: bytes, error: str | None, parent_is_remote: bool) -> bytes:
    """What spans of one kind share, encoded once and kept by the caller: name 5, kind 6, the attributes block
    (field 9, as ``span_attributes`` wrote it), status 15 (message 2, code 3; ERROR with the error as its
    message) and flags 16 (fixed32: the SDK says whether the parent is remote)."""
    status = b"" if error is None else _field(2, _utf8(error)) + bytes((0x18, STATUS_ERROR))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent_is_remote else 0)
    return b"".join((_field(5, _utf8(name)), bytes((0x30, kind)), attributes, _field(15, status), b"\x85\x01",
                     struct.pack("<I", flags)))


# trace_id 1 (16 bytes), span_id 2 (8), parent_span_id 4 (8) when there is one, start 7 and end 8 (fixed64):
# each span's own fields, written by one pack. Their tags and lengths are the pack's constant arguments.
_IDS_AND_TIMES = struct.Struct("<BB16sBB8sBQBQ")
_IDS_PARENT_AND_TIMES = struct.Struct("<BB16sBB8sBB8sBQBQ")


def span(trace_id: bytes, span_id: bytes, parent_span_id: bytes | None, start_ns: int, end_ns: int, shape: bytes,
         own_attributes: bytes = b"") -> bytes:
    """A Span message: its ids and times, then its ``span_shape``, then the attributes that are this span's alone
    (field 9 again: a repeated field's entries may come in parts, in order). Protobuf leaves fields' order to the
    writer, so the shared part is copied whole."""
    if parent_span_id is None:
        ids = _IDS_AND_TIMES.pack(0x0A, 16, trace_id, 0x12, 8, span_id, 0x39, start_ns, 0x41, end_ns)
    else:
        ids = _IDS_PARENT_AND_TIMES.pack(0x0A, 16, trace_id, 0x12, 8, span_id, 0x22, 8, parent_span_id, 0x39,
                                         start_ns, 0x41, end_ns)
    return ids + shape + own_attributes


@functools.lru_cache(maxsize=64)
def _key(key: str) -> bytes:
    return _field(1, _utf8(key))


def string_attribute(key: str, value: str) -> bytes:
    """A span attribute whose value seldom repeats (a request id): written each time, never kept."""
    return _field(9, _key(key) + _field(2, _field(1, _utf8(value))))


class RequestWriter:
    """ExportTraceServiceRequests from one resource and one instrumentation scope, their parts encoded once."""

    def __init__(self, resource: Mapping[str, Any], resource_schema_url: str, scope_name: str, scope_version: str):
        self._resource = _field(1, attributes(1, resource))
        self._resource_schema = _field(3, _utf8(resource_schema_url)) if resource_schema_url else b""
        self._scope = _field(1, _field(1, _utf8(scope_name)) + _field(2, _utf8(scope_version)))

    def request(self, spans: Iterable[bytes]) -> bytes:
        """resource_spans 1: ResourceSpans (resource 1, scope_spans 2, schema_url 3); ScopeSpans: scope 1, spans 2."""
        pieces = [self._scope]
        for encoded in spans:  # each a field 2 of ScopeSpans
            pieces += (b"\x12", _varint(len(encoded)), encoded)
        scope_spans = b"".join(pieces)
        # The two enclosing messages' tags and lengths, then everything copied once.
        inner = len(scope_spans)
        inner_head = b"\x12" + _varint(inner)
        outer = len(self._resource) + len(inner_head) + inner + len(self._resource_schema)
        return b"".join((b"\x0a", _varint(outer), self._resource, inner_head, scope_spans, self._resource_schema))

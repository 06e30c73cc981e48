"""JSON from a peer (a caller's frame, an agent's answer or card, a watch-feed line, an etcd value, a service's
answer), decoded only when it nests no deeper than ``MAX_DEPTH``.

msgspec recurses once per level, skipped unknown members included, and raises RecursionError near the
interpreter's limit (~1,000 levels); what the mesh does with a value afterwards (re-encoding it, walking it)
has bounds of its own. Nesting past the limit is therefore malformed input, refused before decoding as
:class:`TooDeep`, a ``msgspec.DecodeError``: every path that already treats undecodable JSON as the peer's
fault (AGENT_ERROR) or the caller's (400) treats it the same way. The registry, the router, the console and
the command line all import this module from the SDK, the lowest layer they share, as they import the
protocol itself (``agent_reach.atp``).

The check costs two byte counts for the common body: fewer opening brackets than the limit cannot nest
past it. Only a body with more is measured exactly (``depth_exceeds``), at C speed and for less than
decoding it costs.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

import msgspec

# What any part of the mesh decodes: deep enough for any real answer, card or record; shallow enough that
# every walk and encoder stays far inside its own bound (the interpreter's ~1,000 frames, orjson's 254).
MAX_DEPTH = 64
# The levels the mesh adds around a value it passes on: a rest answer in a response frame, that frame in a
# JSON-RPC envelope or as an A2A task's artifact part, a registration's metadata in a watch-feed line.
MESH_WRAPPING = 8
# What the mesh takes in to pass on (an agent's answer at the router, a request body at the registry): held
# to less, so that what the mesh makes of it still decodes wherever it goes next.
MAX_PASSED_DEPTH = MAX_DEPTH - MESH_WRAPPING
# A caller's frame at the router's edge: its payload goes to the agent and may come back in the answer.
MAX_CALLER_DEPTH = 32

T = TypeVar("T")

_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')
_SQUARE = bytes.maketrans(b"{}", b"[]")


class TooDeep(msgspec.DecodeError):
    """JSON nested past the limit: malformed input, whoever sent it."""


def _opening_brackets(data: bytes | str) -> int:
    return data.count("[") + data.count("{") if isinstance(data, str) else data.count(b"[") + data.count(b"{")


def _brackets(raw: bytes) -> bytes:
    """The brackets of a JSON text outside its strings, all as ``[`` and ``]``. Escaped backslashes, then
    escaped quotes, go first (left to right, as a JSON reader pairs them), so every quote left opens or
    closes a string; two adjacent ones hold nothing between them, and whatever lies between the others
    alternately inside and outside a string."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = raw.translate(_SQUARE, _NOT_STRUCTURE).replace(b'""', b"")
    return b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept


def depth_exceeds(data: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``data`` nests arrays and objects deeper than ``limit`` (brackets in strings not counted).
    Each pass removes every innermost pair, one level: brackets left after ``limit`` passes nest deeper
    (or do not balance, which no decoder accepts either)."""
    if _opening_brackets(data) <= limit:
        return False
    brackets = _brackets(data.encode(errors="surrogatepass") if isinstance(data, str) else bytes(data))
    if b"[" * (limit + 1) in brackets:  # the usual attack, known without a pass
        return True
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def check(data: bytes | str, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep when ``data`` nests deeper than ``limit``."""
    if depth_exceeds(data, limit):
        raise TooDeep(f"JSON nesting exceeds the limit of {limit} levels")


@overload
def decode(data: bytes | str, *, strict: bool = True, limit: int = MAX_DEPTH) -> Any: ...
@overload
def decode(data: bytes | str, *, type: type[T], strict: bool = True, limit: int = MAX_DEPTH) -> T: ...
@overload
def decode(data: bytes | str, *, type: Any, strict: bool = True, limit: int = MAX_DEPTH) -> Any: ...
def decode(data: bytes | str, *, type: Any = Any, strict: bool = True, limit: int = MAX_DEPTH) -> Any:
    """``msgspec.json.decode``, for JSON a peer sent."""
    check(data, limit)
    return msgspec.json.decode(data, type=type, strict=strict)


class Decoder(Generic[T]):
    """``msgspec.json.Decoder``, for JSON a peer sent."""

    @overload
    def __init__(self: Decoder[Any], *, limit: int = MAX_DEPTH) -> None: ...
    @overload
    def __init__(self: Decoder[T], type: type[T], *, limit: int = MAX_DEPTH) -> None: ...
    @overload
    def __init__(self: Decoder[Any], type: Any, *, limit: int = MAX_DEPTH) -> None: ...
    def __init__(self, type: Any = Any, *, limit: int = MAX_DEPTH):
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type)
        self.limit = limit

    def decode(self, data: bytes | str) -> T:
        check(data, self.limit)
        return self._decoder.decode(data)

"""The watch feed's events and their JSON-lines codec: what the registry publishes and routers follow.

A follower gets a full ``Reset``, then every committed change (``Put`` / ``Delete``, with the store
revision), ``States`` for soft state (status, load, in-flight) that changed, ``Routers`` (to a
follower that named itself a router) when the set of routers following the mesh changed (each
enforces its share of every limit), and a ``Ping`` when the feed is quiet. In process the events
travel as objects (``WatchFeed``); over HTTP each is one line of ``GET /watch``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any, Protocol

import msgspec
from agent_reach import peer_json

from mesh.records import RECORD_TYPES


class InstanceState(msgspec.Struct, array_like=True, frozen=True):
    state: str
    load: float
    inflight: int | None


class Reset(msgspec.Struct, tag="reset", tag_field="type"):
    revision: int
    records: dict[str, Any]
    states: dict[str, InstanceState]


class Put(msgspec.Struct, tag="put", tag_field="type"):
    revision: int
    key: str
    value: Any


class Delete(msgspec.Struct, tag="delete", tag_field="type"):
    revision: int
    key: str


class States(msgspec.Struct, tag="states", tag_field="type"):
    states: dict[str, InstanceState]


class Ping(msgspec.Struct, tag="ping", tag_field="type"):
    revision: int


class Routers(msgspec.Struct, tag="routers", tag_field="type"):
    """Every live router's id, sorted: a router following the feed enforces 1/len of every limit."""

    routers: list[str]


WatchEvent = Reset | Put | Delete | States | Ping | Routers

# A router's id as it announces itself (`GET /watch?router=ID`): 1-128 visible ASCII characters.
ROUTER_ID_MAX = 128


def valid_router_id(router_id: str) -> bool:
    """Printable and short: the id lands in logs, metrics and `GET /cluster`."""
    return 0 < len(router_id) <= ROUTER_ID_MAX and all("!" <= char <= "~" for char in router_id)


class WatchFeed(Protocol):
    """A feed followed in process (the registry's WatchHub in `agentreach up`), so a router needs no registry."""

    def subscribe(self, since: int | None = None, router_id: str | None = None) -> AsyncIterable[WatchEvent]:
        """The changes after revision ``since`` (a full reset when None or too old); the stream ends when
        the follower falls too far behind, and it subscribes again from its revision. A ``router_id``
        counts the follower as a live router while its stream is open."""
        ...


class _WireReset(msgspec.Struct, tag="reset", tag_field="type"):
    revision: int
    records: dict[str, msgspec.Raw]
    states: dict[str, InstanceState]


class _WirePut(msgspec.Struct, tag="put", tag_field="type"):
    revision: int
    key: str
    value: msgspec.Raw


_encoder = msgspec.json.Encoder()
_WireEvent = _WireReset | _WirePut | Delete | States | Ping | Routers
_wire_decoder: msgspec.json.Decoder[_WireEvent] = msgspec.json.Decoder(_WireEvent)
_json_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    prefix: msgspec.json.Decoder(kind) for prefix, kind in RECORD_TYPES
}


def _json_value(key: str, raw: msgspec.Raw) -> Any:
    for prefix, decoder in _json_decoders.items():
        if key.startswith(prefix):
            return decoder.decode(raw)
    return None


# The longest line a follower reads: a reset carries every record in one line (~1-2 KB an instance),
# far past aiohttp's default line limit (512 KiB, a few hundred instances). A bound still, not a hope.
MAX_EVENT_LINE = 256 * 1024 * 1024


def encode_event(event: WatchEvent) -> bytes:
    """One line of `GET /watch`, newline included."""
    return _encoder.encode(event) + b"\n"


def decode_event(line: bytes) -> WatchEvent:
    """One line of `GET /watch` back into the event the hub published."""
    peer_json.check(line)
    event = _wire_decoder.decode(line)
    if isinstance(event, _WireReset):
        records = {key: _json_value(key, raw) for key, raw in event.records.items()}
        return Reset(revision=event.revision, records=records, states=event.states)
    if isinstance(event, _WirePut):
        return Put(revision=event.revision, key=event.key, value=_json_value(event.key, event.value))
    return event

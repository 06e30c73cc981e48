"""ATP over one WebSocket (``protocol: "websocket"``), as the router and the SDK both speak it.

The router opens one connection per instance endpoint and multiplexes calls on it by ``id`` (the call's
request_id). Every message is binary: an envelope (compact JSON, one line) and, after a newline, the bytes it
carries unchanged — a call's request frame exactly as signed, a chunk event's JSON, a reply's frame. Because
msgspec never writes a raw newline inside JSON, the first newline always ends the envelope.

    router → agent   {"type":"call","id":R,"headers":{...}}\\n<request frame>
                     {"type":"cancel","id":R}\\n                  the router gave up: stop the handler
    agent → router   {"type":"chunk","id":R}\\n<chunk>            one streamed chunk ({"request_id","seq","data"})
                     {"type":"reply","id":R,"status":200}\\n<frame>  the call's one answer, as over HTTP
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from agent_reach import peer_json

CALL: Final = "call"
CANCEL: Final = "cancel"
CHUNK: Final = "chunk"
REPLY: Final = "reply"
# The longest envelope read: ids and a handful of headers, never a payload.
MAX_ENVELOPE_BYTES = 16 * 1024
# Seconds between the pings each end sends; a peer that does not answer one within half of it is dead. Long
# enough that an agent whose loop a handler blocks for seconds (or a router under load) is not cut off with
# its calls: a killed peer is seen at once anyway (its connection closes), calls have their own deadlines.
PING_INTERVAL_S = 20.0


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["call", "cancel", "chunk", "reply"]
    id: str
    status: int = 0
    headers: dict[str, str] = {}


class WireError(ValueError):
    """A message that is no envelope of this protocol: the peer's fault, logged and dropped."""


_encoder = msgspec.json.Encoder()
_envelopes = peer_json.Decoder(Envelope)


def encode(envelope: Envelope, body: bytes = b"") -> bytes:
    return _encoder.encode(envelope) + b"\n" + body


def decode(message: bytes) -> tuple[Envelope, bytes]:
    """The envelope and the bytes it carries; raises WireError for anything else."""
    end = message.find(b"\n", 0, MAX_ENVELOPE_BYTES + 1)
    if end < 0:
        raise WireError(f"no envelope line within {MAX_ENVELOPE_BYTES} bytes")
    try:
        envelope = _envelopes.decode(message[:end])
    except msgspec.MsgspecError as exc:
        raise WireError(f"not an envelope: {exc}") from None
    if not envelope.id:
        raise WireError("an envelope needs an id")
    return envelope, message[end + 1:]

"""ATP over a message broker (``protocol: "mq"``), as the router and the SDK both speak it.

A capability's endpoint names the broker and the capability's request stream: ``redis://host:port/<stream>``
(no credentials: a registered endpoint is public to the mesh; db 0). Every instance of the capability reads that
stream in one consumer group (``GROUP``), so the instances share its calls. An entry carries one message in the
field ``m``: the WebSocket protocol's envelope and body (agent_reach.socket_wire), unchanged:

    router → stream        {"type":"call","id":C,"headers":{..., X-Reach-Reply-To, X-Reach-Deadline-Ms}}\\n<frame>
    agent  → reply stream  {"type":"chunk","id":C,"headers":{X-Reach-Consumer,...}}\\n<chunk>
                           {"type":"reply","id":C,"status":200,"headers":{X-Reach-Consumer,...}}\\n<frame>

``C`` is the call's id, one per attempt (a retry on the same stream is another entry with another id); the
request_id travels in X-Request-Id and the frame. The reply stream is the router's own (one per router
process). An attempt the router gives up on is cancelled by its call id on the stream's cancel channel (for the
instance running it) and by a key (for an instance yet to take it). A call that was delivered more than an
agent's ``max_deliveries`` times goes to the stream's dead-letter stream.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from yarl import URL

SCHEMES: Final = ("redis",)
# The consumer group every instance of a capability reads its request stream in.
GROUP: Final = "agentreach"
# The one field of a stream entry: an envelope and its body (agent_reach.socket_wire.encode).
FIELD: Final = b"m"
# The signed method of an mq call (the path signed is its reply stream: a forged one does not verify).
METHOD: Final = "MQ"
STREAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class MqEndpoint(NamedTuple):
    broker: str  # redis://host:port
    stream: str


def parse_endpoint(endpoint: str) -> MqEndpoint:
    """The broker and request stream an mq endpoint names; ValueError saying why when it names none."""
    try:
        url = URL(endpoint)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if url.scheme not in SCHEMES or not url.host:
        raise ValueError(f"an mq endpoint names its broker: expected redis://host:port/<stream>, got {endpoint!r}")
    if url.user is not None or url.password is not None:
        raise ValueError("an mq endpoint may not carry credentials (the registry shows it to the whole mesh)")
    if url.query_string or url.fragment:
        raise ValueError("an mq endpoint has no query or fragment")
    stream = url.path.removeprefix("/")
    if not STREAM.fullmatch(stream):
        raise ValueError(f"the request stream {stream!r} must match {STREAM.pattern}")
    return MqEndpoint(broker_origin(endpoint), stream)


def broker_origin(url: str) -> str:
    """``redis://host:port`` of a broker URL (its credentials, db and path left out): what a router compares."""
    parsed = URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port or 6379}"


def endpoint_for(broker: str, stream: str) -> str:
    return f"{broker_origin(broker)}/{stream}"


def dead_letters(stream: str) -> str:
    """Where an agent puts the calls it cannot serve (garbage, forged, delivered too often)."""
    return f"{stream}.dead"


def cancel_channel(stream: str) -> str:
    return f"{stream}.cancel"


def cancelled_key(stream: str, call_id: str) -> str:
    return f"{stream}.cancelled.{call_id}"


def nonce_key(stream: str, nonce: str) -> str:
    """A signature's nonce, shared by the stream's instances: a replay is refused by any of them."""
    return f"{stream}.nonce.{nonce}"

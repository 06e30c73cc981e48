"""The event parser every hop of a stream reads with: events however the bytes are cut."""

from __future__ import annotations

from agent_reach.sse import Event, EventParser


def fed(*pieces: bytes) -> list[Event]:
    parser = EventParser()
    return [event for piece in pieces for event in parser.feed(piece)]


def test_events_come_out_whole_however_the_bytes_are_cut():
    stream = (b'event: chunk\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: a comment\r\ndata: "plain"\r\n\r\n'
              b"event: response\ndata: 2\n\n")
    expected = [Event("chunk", b'{"a":\n1}'), Event("message", b'"plain"'), Event("response", b"2")]
    assert fed(stream) == expected
    for cut in range(1, len(stream)):
        assert fed(stream[:cut], stream[cut:]) == expected, cut
    assert fed(*(stream[i:i + 1] for i in range(len(stream)))) == expected


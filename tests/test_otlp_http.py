"""The exporter process's POST to a real collector on 127.0.0.1 (router/otlp_http.py): the SDK's variables
read as the SDK reads them, headers and compression on the wire, the retryable answers tried again and the
others dropped at once, a lost kept-alive connection opened again, and a collector that is down costing at
most the timeout."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from log_support import LogLines
from recording_support import Received, RecordingServer
from router.otlp_http import CollectorClient, CollectorConfig, UnusableEndpoint, collector_config

BODY = b"\x0a\x00" * 40


def config(url: str, **changes: object) -> CollectorConfig:
    return CollectorConfig(**({"url": url, "headers": {}, "timeout": 5.0, "compression": "none"} | changes))


def answering(*statuses: int) -> RecordingServer:
    """A collector answering each request with the next status (the last one for ever)."""
    queue = list(statuses)

    async def answer(request: web.Request, received: Received) -> web.Response:
        return web.Response(status=queue.pop(0) if len(queue) > 1 else queue[0])

    return RecordingServer(answer)


def test_the_variables_are_read_as_the_sdk_reads_them() -> None:
    assert collector_config(None, {}).url == "http://localhost:4318/v1/traces"
    assert collector_config("http://c:4318/", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/y"}).url == \
        "http://c:4318/v1/traces"
    assert collector_config(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).url == "http://c:4318/v1/traces"
    given = collector_config(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/custom/path"})
    assert given.url == "http://t:1/custom/path"
    both = collector_config(None, {
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=general", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=t%20x,b=2",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1.5",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem"})
    assert (both.headers, both.timeout, both.compression, both.certificate) == (
        {"api-key": "t x", "b": "2"}, 1.5, "gzip", "/etc/ca.pem")


@pytest.mark.parametrize("endpoint", ["collector:4318", "ftp://collector:21", "http://", "http://[::1"])
def test_an_endpoint_that_cannot_be_sent_to_is_refused(endpoint: str) -> None:
    with pytest.raises(UnusableEndpoint, match="OTLP endpoint"):
        collector_config(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint})


def test_a_bad_timeout_or_compression_falls_back_with_a_warning(router_logs: LogLines) -> None:
    chosen = collector_config(None, {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon", "OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"})
    assert (chosen.timeout, chosen.compression) == (10.0, "none")
    assert [line["event"] for line in router_logs.lines] == [
        "OTEL_EXPORTER_OTLP_TIMEOUT is not a number of seconds; using the default",
        "unknown OTEL_EXPORTER_OTLP_COMPRESSION; sending uncompressed"]


async def test_a_header_that_cannot_be_sent_is_left_out_not_fatal(router_logs: LogLines) -> None:
    chosen = collector_config(None, {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=ok,x-bad=a%0D%0AInjected%3A%201,nul=%00"})
    assert chosen.headers == {"api-key": "ok"}
    assert [line["header"] for line in router_logs.lines] == ["x-bad", "nul"]
    collector = await answering(200).start()
    try:
        assert await asyncio.to_thread(CollectorClient(config(collector.url, headers=chosen.headers)).send, BODY)
    finally:
        await collector.stop()
    assert "Injected" not in collector.received[0].headers


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
async def test_headers_path_and_compression_reach_the_collector(compression: str) -> None:
    collector = await answering(200).start()
    try:
        client = CollectorClient(config(f"{collector.url}/custom/v1/traces?x=1", compression=compression,
                                        headers={"Authorization": "Bearer abc"}))
        assert await asyncio.to_thread(client.send, BODY)
        assert await asyncio.to_thread(client.send, BODY)
        client.close()
    finally:
        await collector.stop()
    first, second = collector.received
    assert (first.method, first.path, first.headers["Authorization"]) == ("POST", "/custom/v1/traces", "Bearer abc")
    assert first.headers["Content-Type"] == "application/x-protobuf"
    assert first.headers.get("Content-Encoding") == (None if compression == "none" else compression)
    # aiohttp decompresses as the Content-Encoding says: the body only reads back whole if it was so compressed.
    assert first.body == second.body == BODY


async def test_a_busy_collector_is_tried_again_and_a_refusing_one_is_not(router_logs: LogLines) -> None:
    busy, refusing = await answering(503, 200).start(), await answering(400).start()
    try:
        started = time.monotonic()
        assert await asyncio.to_thread(CollectorClient(config(busy.url)).send, BODY)
        waited = time.monotonic() - started
        refused = CollectorClient(config(refusing.url))
        assert not await asyncio.to_thread(refused.send, BODY)
        assert not await asyncio.to_thread(refused.send, BODY)
    finally:
        await busy.stop()
        await refusing.stop()
    assert len(busy.received) == 2 and waited >= 0.8  # one back-off of 1 s, jittered by ±20 %
    assert len(refusing.received) == 2  # one request a batch, never repeated
    assert [line["event"] for line in router_logs.lines] == [
        "OTLP export failing; batches are dropped until the collector answers"]
    assert router_logs.lines[0]["collector"] == refusing.url and refused.failing


async def test_the_collectors_credentials_stay_out_of_the_log(router_logs: LogLines) -> None:
    collector = await answering(401).start()
    try:
        client = CollectorClient(config(f"http://user:secret@127.0.0.1:{collector.port}/v1/traces?token=abc"))
        assert not await asyncio.to_thread(client.send, BODY)
    finally:
        await collector.stop()
    [line] = router_logs.lines
    assert line["collector"] == f"http://127.0.0.1:{collector.port}/v1/traces"
    assert "secret" not in str(line) and "abc" not in str(line)


async def test_a_retry_on_a_kept_connection_ends_by_the_deadline() -> None:
    """503 at once, then an answer that never comes: the retry's wait is what is left of the timeout."""
    answered = 0

    async def busy_then_silent(request: web.Request, received: Received) -> web.Response:
        nonlocal answered
        answered += 1
        if answered == 1:
            return web.Response(status=503)
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    collector = await RecordingServer(busy_then_silent).start()
    client = CollectorClient(config(f"{collector.url}/v1/traces", timeout=3.0))
    try:
        started = time.monotonic()
        assert not await asyncio.to_thread(client.send, BODY)
        took = time.monotonic() - started
    finally:
        client.close()
        await collector.stop()
    assert len(collector.received) == 2
    assert took < 3.7  # the deadline (3 s) and some slack; the first try's 3 s socket timeout would end past 3.8


async def test_a_collector_that_closed_the_connection_is_reached_on_a_new_one() -> None:
    collector = await answering(200).start()
    client = CollectorClient(config(collector.url))
    try:
        assert await asyncio.to_thread(client.send, BODY)
        await collector.stop()  # every kept-alive connection is closed
        await collector.start(collector.port)
        assert await asyncio.to_thread(client.send, BODY)
    finally:
        client.close()
        await collector.stop()
    assert len(collector.received) == 2


async def test_a_collector_that_is_down_costs_at_most_the_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = CollectorClient(config(f"http://127.0.0.1:{port}/v1/traces", timeout=1.0))
    started = time.monotonic()
    assert not await asyncio.to_thread(client.send, BODY)
    assert time.monotonic() - started < 1.5
    assert client.failing

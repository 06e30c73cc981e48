"""Quality scores per instance (issue 15): stored by the registry over its admin API, durable in the
WAL and in etcd, carried to every router over the watch feed, bad input refused naming the field."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from conftest import admin_key, call, registration, wait_for
from etcd_support import EtcdCluster
from mesh.keyspace import KeySpace
from mesh.quality import MAX_SOURCE_CHARS, QualityScore, quality_key
from mesh.records import decode_value, encode_value
from mesh.watch import Put, decode_event, encode_event
from registry.server import RegistryServer
from router.server import RouterServer, RouterServerSettings

Start = Callable[..., Awaitable[RegistryServer]]


def keys(server: RegistryServer) -> KeySpace:
    """The key space a running registry holds."""
    assert server.registry is not None
    return server.registry.state.keys


async def scored_mesh(registry: RegistryServer, http: aiohttp.ClientSession, key: str | None = None) -> None:
    """Two instances of ticket.triage and one of order.query, registered through the admin key."""
    for body in (registration("triage-a", "ticket.triage", service="triage"),
                 registration("triage-b", "ticket.triage", service="triage"),
                 registration("orders-a", "order.query", service="orders")):
        status, answer = await call(http, "POST", f"{registry.url}/register", key, body)
        assert status == 200, answer


async def test_put_get_delete_over_http_and_admin_only(start_registry: Start, http: aiohttp.ClientSession) -> None:
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    await scored_mesh(registry, http, key)
    url = f"{registry.url}/quality/ticket.triage"
    status, saved = await call(http, "PUT", f"{url}/triage-b", key, {"score": 0.42, "source": "golden-set-2026-12"})
    assert status == 200 and saved["score"] == 0.42 and saved["source"] == "golden-set-2026-12", saved
    assert saved["capability"] == "ticket.triage" and saved["agent_id"] == "triage-b" and saved["posted_at"] > 0
    assert (await call(http, "PUT", f"{url}/triage-a", key, {"score": 1}))[0] == 200
    status, listed = await call(http, "GET", url, key)
    assert status == 200 and [(v["agent_id"], v["score"], v["source"]) for v in listed] == [
        ("triage-a", 1.0, None), ("triage-b", 0.42, "golden-set-2026-12")]
    # A second post replaces the first: one score per instance and capability.
    assert (await call(http, "PUT", f"{url}/triage-b", key, {"score": 0.9}))[1]["source"] is None
    assert [v["score"] for v in (await call(http, "GET", url, key))[1]] == [1.0, 0.9]
    assert (await call(http, "GET", f"{registry.url}/quality/order.query", key)) == (200, [])

    status, deleted = await call(http, "DELETE", f"{url}/triage-b", key)
    assert status == 200 and deleted == {"capability": "ticket.triage", "agent_id": "triage-b", "deleted": True}
    assert [v["agent_id"] for v in (await call(http, "GET", url, key))[1]] == ["triage-a"]
    for method, path, body in (("GET", url, None), ("PUT", f"{url}/triage-a", {"score": 0}),
                               ("DELETE", f"{url}/triage-a", None)):
        status, refused = await call(http, method, path, None, body)
        assert status == 401, refused
    assert [v["score"] for v in (await call(http, "GET", url, key))[1]] == [1.0]


@pytest.mark.parametrize(("path", "body", "status", "code", "field"), [
    ("/quality/ticket.triage/triage-a", {"score": 1.5}, 400, "invalid_field", "score"),
    ("/quality/ticket.triage/triage-a", {"score": -0.01}, 400, "invalid_field", "score"),
    ("/quality/ticket.triage/triage-a", {"score": "good"}, 400, "invalid_field", "score"),
    ("/quality/ticket.triage/triage-a", {}, 400, "missing_field", "score"),
    ("/quality/ticket.triage/triage-a", {"score": 0.5, "source": "x" * (MAX_SOURCE_CHARS + 1)}, 400,
     "invalid_field", "source"),
    ("/quality/ticket.triage/triage-a", {"score": 0.5, "weight": 2}, 400, "unknown_field", "weight"),
    ("/quality/no.such/triage-a", {"score": 0.5}, 404, "unknown_capability", "capability"),
    ("/quality/ticket.triage/orders-a", {"score": 0.5}, 404, "unknown_agent", "agent_id"),
    ("/quality/ticket.triage/nobody", {"score": 0.5}, 404, "unknown_agent", "agent_id"),
    ("/quality/ticket.triage/bad%20id", {"score": 0.5}, 400, "invalid_field", "agent_id"),
    ("/quality/bad%20name/triage-a", {"score": 0.5}, 400, "invalid_field", "capability"),
])
async def test_bad_input_names_the_field_and_stores_nothing(start_registry: Start, http: aiohttp.ClientSession,
                                                            path: str, body: Any, status: int, code: str,
                                                            field: str) -> None:
    registry = await start_registry()
    await scored_mesh(registry, http)
    revision = registry.store.revision
    answer = await call(http, "PUT", f"{registry.url}{path}", body=body)
    assert answer[0] == status and answer[1]["error"] == code and answer[1]["field"] == field, answer
    assert registry.store.revision == revision and keys(registry).quality == {}


async def test_deleting_a_score_never_posted_is_a_404(registry: RegistryServer, http: aiohttp.ClientSession) -> None:
    await scored_mesh(registry, http)
    status, answer = await call(http, "DELETE", f"{registry.url}/quality/ticket.triage/triage-a")
    assert status == 404 and answer["error"] == "quality_not_found" and answer["field"] == "agent_id", answer


async def test_scores_survive_a_restart(start_registry: Start, http: aiohttp.ClientSession, tmp_path: Any) -> None:
    data_dir = tmp_path / "scored"
    registry = await start_registry(data_dir)
    await scored_mesh(registry, http)
    for agent_id, score in (("triage-a", 0.8), ("triage-b", 0.1)):
        assert (await call(http, "PUT", f"{registry.url}/quality/ticket.triage/{agent_id}", body={"score": score}))[0] \
            == 200
    assert (await call(http, "DELETE", f"{registry.url}/quality/ticket.triage/triage-a"))[0] == 200
    before = (await call(http, "GET", f"{registry.url}/quality/ticket.triage"))[1]
    await registry.stop()

    restarted = await start_registry(data_dir)
    assert (await call(http, "GET", f"{restarted.url}/quality/ticket.triage"))[1] == before
    assert [v["score"] for v in before] == [0.1]


async def test_a_score_reaches_a_router_over_the_feed(start_registry: Start, http: aiohttp.ClientSession) -> None:
    registry = await start_registry(auth=True)
    key = admin_key(registry)
    await scored_mesh(registry, http, key)
    router = RouterServer(RouterServerSettings(port=0, registry_url=registry.url, registry_key=key))
    await router.start()
    try:
        url = f"{registry.url}/quality/ticket.triage/triage-b"
        assert (await call(http, "PUT", url, key, {"score": 0.3}))[0] == 200
        await wait_for(lambda: router.mirror.quality("ticket.triage", "triage-b") == 0.3, timeout=5,
                       what="the router to learn the score")
        assert router.mirror.quality("ticket.triage", "triage-a") is None
        assert router.mirror.quality("order.query", "triage-b") is None
        assert (await call(http, "DELETE", url, key))[0] == 200
        await wait_for(lambda: router.mirror.quality("ticket.triage", "triage-b") is None, timeout=5,
                       what="the router to forget the score")
    finally:
        await router.stop()


async def test_a_score_stored_in_etcd_is_read_at_every_node(etcd_cluster: Callable[[], Awaitable[EtcdCluster]],
                                                          etcd_registry: Start, http: aiohttp.ClientSession) -> None:
    cluster = await etcd_cluster()
    first, second = await etcd_registry(cluster), await etcd_registry(cluster)
    await scored_mesh(first, http)
    await wait_for(lambda: "ticket.triage" in keys(second).offers, timeout=10,
                   what="the second node to see the registrations")
    assert (await call(http, "PUT", f"{second.url}/quality/ticket.triage/triage-a", body={"score": 0.25}))[0] == 200

    async def listed_at_first() -> bool:
        status, listed = await call(http, "GET", f"{first.url}/quality/ticket.triage")
        return status == 200 and [v["score"] for v in listed] == [0.25]
    await wait_for(listed_at_first, timeout=10, what="the first node to read the score")
    # A floor set at one node: both nodes judge the score below it from the same records.
    assert (await call(http, "PUT", f"{first.url}/policies/ticket.triage", body={"quality_floor": 0.5}))[0] == 200

    async def alerting_at_both() -> bool:
        answers = [await call(http, "GET", f"{server.url}/quality") for server in (first, second)]
        return all([a["agent_id"] for a in body["alerts"]] == ["triage-a"] for _, body in answers)
    await wait_for(alerting_at_both, timeout=10, what="both nodes to raise the alert")
    assert (await call(http, "DELETE", f"{first.url}/quality/ticket.triage/triage-a"))[0] == 200
    await wait_for(lambda: keys(second).quality == {} and second.registry and not second.registry.quality.alerts(),
                   timeout=10, what="the second node to forget the score and resolve its alert")


def test_quality_scores_keep_their_stored_and_feed_layout() -> None:
    """A stored format (the WAL replays these bytes, routers decode these lines): pinned like mesh_contract's."""
    score = QualityScore(score=0.75, source="golden", posted_at=1.5)
    stored = (b"\x83\xa5score\xcb?\xe8\x00\x00\x00\x00\x00\x00\xa6source\xa6golden\xa9posted_at"
              b"\xcb?\xf8\x00\x00\x00\x00\x00\x00")
    key = quality_key("ticket.triage", "triage-a")
    assert key == "quality/ticket.triage/triage-a"
    assert encode_value(score) == stored and decode_value(key, stored) == score
    line = b'{"type":"put","revision":4,"key":"' + key.encode() + b'","value":{"score":0.75,"source":"golden",' \
        b'"posted_at":1.5}}'
    event = decode_event(line)
    assert event == Put(revision=4, key=key, value=score) and encode_event(event) == line + b"\n"
    space = KeySpace()
    space.put(key, score)
    assert space.quality == {"ticket.triage": {"triage-a": score}}
    space.delete(key)
    assert space.quality == {}


async def test_a_score_is_forgotten_with_its_agent_id(start_registry: Start, http: aiohttp.ClientSession) -> None:
    """Once the registry forgets a deregistered agent_id (past the bindings it keeps) its scores go too: they
    are bounded by the instances and bindings kept, and another service taking the id inherits nothing."""
    registry = await start_registry(kept_agent_ids=1)
    await scored_mesh(registry, http)
    for agent_id in ("triage-a", "triage-b"):
        assert (await call(http, "PUT", f"{registry.url}/quality/ticket.triage/{agent_id}", body={"score": 0.5}))[0] \
            == 200
    assert (await call(http, "POST", f"{registry.url}/deregister", body={"agent_id": "triage-a"}))[0] == 200
    assert set(keys(registry).quality["ticket.triage"]) == {"triage-a", "triage-b"}  # its binding is kept
    assert (await call(http, "POST", f"{registry.url}/deregister", body={"agent_id": "triage-b"}))[0] == 200
    assert set(keys(registry).quality["ticket.triage"]) == {"triage-b"}

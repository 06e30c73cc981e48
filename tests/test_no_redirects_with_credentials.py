"""Clients that carry credentials never follow a redirect: aiohttp would send the same headers (the
caller's X-API-Key, an agent's registration token, a router's admin key) to wherever it points."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from agent_reach import ReachClient, ReachError
from aiohttp import web

from conftest import wait_for
from recording_support import Received, RecordingServer
from router.feed import follow_http
from router.mirror import RegistryMirror
from router.publish import PublishRefused, publish_over_http


async def ok(request: web.Request, received: Received) -> web.Response:
    return web.json_response({})


@contextlib.asynccontextmanager
async def redirecting() -> AsyncIterator[tuple[RecordingServer, RecordingServer]]:
    """A server that answers 307 to everything, pointing at a second that records what reaches it."""
    elsewhere = await RecordingServer(ok).start()

    async def redirect(request: web.Request, received: Received) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{elsewhere.url}{request.path}")

    redirector = await RecordingServer(redirect).start()
    try:
        yield redirector, elsewhere
    finally:
        await redirector.stop()
        await elsewhere.stop()


async def test_reach_client_does_not_take_its_api_key_to_a_redirect() -> None:
    async with redirecting() as (redirector, elsewhere):
        async with ReachClient(redirector.url, api_key="ark_secret") as client:
            with pytest.raises(ReachError):
                await client.call("x.cap", {"q": 1})
        assert redirector.at("/atp") and elsewhere.received == []


async def test_router_sends_its_admin_key_to_no_redirect(http: aiohttp.ClientSession) -> None:
    async with redirecting() as (redirector, elsewhere):
        with pytest.raises(PublishRefused):
            await publish_over_http(http, redirector.url, "ara_admin", [])
        following = asyncio.create_task(follow_http(http, redirector.url, RegistryMirror(), admin_key="ara_admin"))
        try:
            # A second attempt starts only once the first (and any redirect it followed) is over.
            await wait_for(lambda: len(redirector.at("/watch")) >= 2, what="the follower's second attempt")
        finally:
            following.cancel()
        assert elsewhere.received == []

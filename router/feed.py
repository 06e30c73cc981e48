"""Keep a RegistryMirror current: from a watch feed in the same process, or from `GET /watch`."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp
from agent_reach.headers import API_KEY_HEADER

from mesh.watch import WatchFeed, decode_event
from router.mirror import RegistryMirror

log = logging.getLogger("agentreach.router.feed")

MAX_BACKOFF = 5.0


async def follow_hub(hub: WatchFeed, mirror: RegistryMirror) -> None:
    """In-process: read the hub's events directly; resubscribe from our revision if dropped."""
    while True:
        async for event in hub.subscribe(mirror.revision if mirror.synced else None):
            mirror.apply(event)
        await asyncio.sleep(0)


async def follow_http(session: aiohttp.ClientSession, registry_url: str, mirror: RegistryMirror,
                      synced: asyncio.Event | None = None, admin_key: str | None = None) -> None:
    """Remote: stream `GET /watch`, resume by revision after a break, keep the last view meanwhile.

    The feed carries credentials' digests, so the registry serves it to the admin key only."""
    headers = {API_KEY_HEADER: admin_key} if admin_key else {}
    backoff = 0.1
    while True:
        params = {"since": str(mirror.revision)} if mirror.synced else {}
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=2, sock_read=15)
            async with session.get(f"{registry_url}/watch", params=params, headers=headers,
                                   timeout=timeout) as response:
                response.raise_for_status()
                log.info("following registry", extra={"registry": registry_url, "since": params.get("since")})
                backoff = 0.1
                async for line in response.content:
                    mirror.apply(decode_event(line))
                    if synced is not None and mirror.synced:
                        synced.set()
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("registry watch interrupted; routing on the last view",
                        extra={"registry": registry_url, "error": repr(exc), "retry_in_s": round(backoff, 2)})
        await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
        backoff = min(MAX_BACKOFF, backoff * 2)

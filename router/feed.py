"""Keep a RegistryMirror current: from a watch feed in the same process, or from `GET /watch`."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from agent_reach.headers import API_KEY_HEADER
from agent_reach.transport import Failover

from mesh.watch import MAX_EVENT_LINE, WatchFeed, decode_event
from router.mirror import RegistryMirror

log = logging.getLogger("agentreach.router.feed")


async def follow_hub(hub: WatchFeed, mirror: RegistryMirror) -> None:
    """In-process: read the hub's events directly; resubscribe from our revision if dropped. The router
    names itself, so it counts among the live routers while it follows."""
    while True:
        async for event in hub.subscribe(mirror.revision if mirror.synced else None, router_id=mirror.router_id):
            mirror.apply(event)
        await asyncio.sleep(0)


async def follow_http(session: aiohttp.ClientSession, registries: Failover | str, mirror: RegistryMirror,
                      synced: asyncio.Event | None = None, admin_key: str | None = None) -> None:
    """Remote: stream `GET /watch` from one registry of the list, and after a break resume by revision
    from it or the next (one that does not know the revision answers with a reset); keep the last
    view meanwhile. Each break backs that registry off, so a dead one is skipped while another answers.

    The router names itself (``router``), so it counts among the live routers while its stream is open.
    The feed carries credentials' digests, so the registry serves it to the admin key only."""
    registries = registries if isinstance(registries, Failover) else Failover(registries)
    headers = {API_KEY_HEADER: admin_key} if admin_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=2, sock_read=15)
    while True:
        registry_url = registries.order()[0]
        params = {"router": mirror.router_id, **({"since": str(mirror.revision)} if mirror.synced else {})}
        error: Exception | None = None
        try:
            async with session.get(f"{registry_url}/watch", params=params, headers=headers, allow_redirects=False,
                                   timeout=timeout) as response:
                response.raise_for_status()
                registries.answered(registry_url)
                log.info("following registry", extra={"registry": registry_url, "since": params.get("since")})
                while line := await response.content.readuntil(b"\n", max_size=MAX_EVENT_LINE):
                    mirror.apply(decode_event(line))
                    if synced is not None and mirror.synced:
                        synced.set()
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            error = exc
        retry_in = registries.failed(registry_url)
        log.warning("registry watch interrupted; routing on the last view",
                    extra={"registry": registry_url, "error": repr(error), "retry_in_s": round(retry_in, 2)})
        await asyncio.sleep(registries.wait())

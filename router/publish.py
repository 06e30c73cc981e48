"""Publishing a router's token verifying keys through the registry, so any router accepts its tokens."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from agent_reach.headers import API_KEY_HEADER

from auth.records import PublishedKey

PublishKeys = Callable[[list[PublishedKey]], Awaitable[None]]

_TIMEOUT = aiohttp.ClientTimeout(total=5, sock_connect=2)


class PublishRefused(Exception):
    """The registry answered, but not with a yes."""


async def publish_over_http(session: aiohttp.ClientSession, registry_url: str, admin_key: str | None,
                            keys: list[PublishedKey]) -> None:
    headers = {"Content-Type": "application/json", **({API_KEY_HEADER: admin_key} if admin_key else {})}
    async with session.put(f"{registry_url}/signing-keys", data=msgspec.json.encode(keys), headers=headers,
                           allow_redirects=False,
                           timeout=_TIMEOUT) as response:
        if response.status != 200:
            raise PublishRefused(f"registry answered {response.status}: {(await response.read())[:200]!r}")

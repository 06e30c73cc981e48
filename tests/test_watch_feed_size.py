"""A router following `GET /watch` over HTTP takes a reset of any realistic size.

The reset line carries every record at once (about 1 KB an instance here), so a few hundred
instances pass aiohttp's default line limit (512 KiB): the follower must read the line whole.
"""

from __future__ import annotations

import asyncio

from agent_reach.serving import cancel

from conftest import post, registration, wait_for
from router.feed import follow_http
from router.mirror import RegistryMirror


async def test_a_follower_loads_a_reset_larger_than_a_stream_line(registry, http):
    for n in range(800):
        body = registration(f"big-{n}", f"cap.big{n}", service=f"svc{n}")
        body["capabilities"][0]["description"] = "d" * 400
        assert (await post(http, f"{registry.url}/register", body))[0] == 200
    mirror = RegistryMirror()
    task = asyncio.create_task(follow_http(http, registry.url, mirror))
    try:
        await wait_for(lambda: mirror.synced and len(mirror.instances) == 800,
                       what="the follower to load 800 instances")
    finally:
        await cancel(task)

"""The admin-only guard: one rule for operator endpoints, whatever checks the key.

The registry checks the admin key against its auth book, the router against its mirror of it, and the
console against its sessions (or asks the registry): each passes its check as a ``Refusal``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from weblayer.errors import ApiError

# What to answer a request that does not come from an operator; None lets it through.
Refusal = Callable[[web.Request], Awaitable[ApiError | None]]


async def require_admin(request: web.Request, refusal: Refusal) -> None:
    refused = await refusal(request)
    if refused is not None:
        raise refused


def admin_only(handler: Handler, refusal: Refusal) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        await require_admin(request, refusal)
        return await handler(request)
    return guarded

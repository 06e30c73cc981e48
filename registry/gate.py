"""Who may call which registry endpoint: agents with their registration token, operators with the admin key.

With auth off (development) every check passes and agents are bound to no service.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from auth.book import AuthBook
from auth.headers import presented_key
from auth.records import TokenRecord
from weblayer.errors import ApiError

_HOW = "send it as X-API-Key or Authorization: Bearer"


def _missing(what: str) -> ApiError:
    return ApiError(401, "unauthenticated", f"This endpoint needs {what}; {_HOW}", "Authorization")


class Gate:
    def __init__(self, book: AuthBook, enabled: bool):
        self.book = book
        self.enabled = enabled

    async def admin_refusal(self, request: web.Request) -> ApiError | None:
        """The registry's check for weblayer.guard.admin_only: the admin key, or why not."""
        if not self.enabled:
            return None
        key = presented_key(request.headers)
        if key is None:
            return _missing("the admin key")
        if self.book.is_admin(key):
            return None
        if self.book.token(key) is not None or self.book.client_by_api_key(key) is not None:
            return ApiError(403, "forbidden", "This endpoint needs the admin key; the credential sent is not it",
                            "Authorization")
        return ApiError(401, "unauthenticated", f"The credential sent is not valid; {_HOW}", "Authorization")

    def agent(self, headers: Mapping[str, str]) -> TokenRecord | None:
        """The registration token presented; None when auth is off or the admin key is presented
        (an operator may register any service's instances)."""
        if not self.enabled:
            return None
        key = presented_key(headers)
        if key is None:
            raise _missing("a registration token")
        token = self.book.token(key)
        if token is not None:
            return token
        if self.book.is_admin(key):
            return None
        raise ApiError(401, "unauthenticated", "Unknown or revoked registration token", "Authorization")

    def reader(self, headers: Mapping[str, str]) -> None:
        """Discovery (`/query`): agents (for their direct fallback) and operators."""
        self.agent(headers)

"""Who may call which registry endpoint: agents with their registration token, operators with the admin key.

With auth off (development) every check passes and agents are bound to no service.
"""

from __future__ import annotations

from collections.abc import Mapping

from auth.book import AuthBook
from auth.headers import presented_key
from auth.records import TokenRecord

from registry.errors import RegistryError

_HOW = "send it as X-API-Key or Authorization: Bearer"


class Gate:
    def __init__(self, book: AuthBook, enabled: bool):
        self.book = book
        self.enabled = enabled

    def admin(self, headers: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        key = self._key(headers, "the admin key")
        if not self.book.is_admin(key):
            self._refuse(key, "the admin key")

    def agent(self, headers: Mapping[str, str]) -> TokenRecord | None:
        """The registration token presented; None when auth is off or the admin key is presented
        (an operator may register any service's instances)."""
        if not self.enabled:
            return None
        key = self._key(headers, "a registration token")
        token = self.book.token(key)
        if token is not None:
            return token
        if self.book.is_admin(key):
            return None
        raise RegistryError(401, "unauthenticated", "Unknown or revoked registration token", "Authorization")

    def reader(self, headers: Mapping[str, str]) -> None:
        """Discovery (`/query`): agents (for their direct fallback) and operators."""
        self.agent(headers)

    def _key(self, headers: Mapping[str, str], what: str) -> str:
        key = presented_key(headers)
        if key is None:
            raise RegistryError(401, "unauthenticated", f"This endpoint needs {what}; {_HOW}", "Authorization")
        return key

    def _refuse(self, key: str, what: str) -> None:
        if self.book.token(key) is not None or self.book.client_by_api_key(key) is not None:
            raise RegistryError(403, "forbidden", f"This endpoint needs {what}; the credential sent is not it",
                                "Authorization")
        raise RegistryError(401, "unauthenticated", f"The credential sent is not valid; {_HOW}", "Authorization")

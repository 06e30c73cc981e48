"""Callers, registration tokens and the admin key, indexed for lookup by their secrets' digests.

The registry's state and the router's mirror both keep one, fed from the same store changes
(the registry from its WAL, the router from the watch feed), so both answer alike.
"""

from __future__ import annotations

from auth.records import (
    ADMIN_KEY,
    CLIENT_PREFIX,
    PUBLISHED_KEY_PREFIX,
    TOKEN_PREFIX,
    AdminRecord,
    ClientRecord,
    PublishedKey,
    TokenRecord,
)
from auth.secrets import digest, matches

PREFIXES = (CLIENT_PREFIX, TOKEN_PREFIX, ADMIN_KEY, PUBLISHED_KEY_PREFIX)


class AuthBook:
    def __init__(self) -> None:
        self.clients: dict[str, ClientRecord] = {}
        self.tokens: dict[str, TokenRecord] = {}
        self.admin: AdminRecord | None = None
        # Every router's token-verifying public keys, by kid.
        self.published_keys: dict[str, PublishedKey] = {}
        self._by_api_key: dict[str, str] = {}
        self._by_token: dict[str, str] = {}

    @staticmethod
    def holds(key: str) -> bool:
        return key.startswith(PREFIXES)

    def put(self, key: str, value: object) -> None:
        if key.startswith(CLIENT_PREFIX) and isinstance(value, ClientRecord):
            self.delete(key)
            self.clients[value.client_id] = value
            self._by_api_key[value.api_key_digest] = value.client_id
        elif key.startswith(TOKEN_PREFIX) and isinstance(value, TokenRecord):
            self.delete(key)
            self.tokens[value.token_id] = value
            self._by_token[value.token_digest] = value.token_id
        elif key == ADMIN_KEY and isinstance(value, AdminRecord):
            self.admin = value
        elif key.startswith(PUBLISHED_KEY_PREFIX) and isinstance(value, PublishedKey):
            self.published_keys[value.kid] = value

    def delete(self, key: str) -> None:
        if key.startswith(CLIENT_PREFIX):
            previous = self.clients.pop(key[len(CLIENT_PREFIX):], None)
            if previous is not None:
                self._by_api_key.pop(previous.api_key_digest, None)
        elif key.startswith(TOKEN_PREFIX):
            token = self.tokens.pop(key[len(TOKEN_PREFIX):], None)
            if token is not None:
                self._by_token.pop(token.token_digest, None)
        elif key == ADMIN_KEY:
            self.admin = None
        elif key.startswith(PUBLISHED_KEY_PREFIX):
            self.published_keys.pop(key[len(PUBLISHED_KEY_PREFIX):], None)

    def client_by_api_key(self, api_key: str) -> ClientRecord | None:
        """The enabled client holding this API key, if any."""
        client_id = self._by_api_key.get(digest(api_key))
        client = self.clients.get(client_id) if client_id is not None else None
        return client if client is not None and client.enabled else None

    def token(self, registration_token: str) -> TokenRecord | None:
        """The unrevoked registration token with this value, if any."""
        token_id = self._by_token.get(digest(registration_token))
        token = self.tokens.get(token_id) if token_id is not None else None
        return token if token is not None and not token.revoked else None

    def is_admin(self, key: str) -> bool:
        return self.admin is not None and matches(key, self.admin.key_digest)

    def signing_key(self, token_id: str | None) -> str | None:
        """The key to sign calls to an instance registered with ``token_id``; None if unknown or revoked.

        Held in the clear in a router's mirror (the watch feed opens it); the registry's own book
        keeps tokens as the log does, sealed, and answers None."""
        token = self.tokens.get(token_id) if token_id is not None else None
        return token.signing_key if token is not None and not token.revoked else None

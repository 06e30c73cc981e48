"""Who may use the mesh: callers (clients), agent registration tokens and the admin key.

The admin API's operations, free of HTTP. Every change is a store write (the WAL); the state
and every router's mirror learn it from the committed change, like any other record. A token's
call-signing key reaches the log sealed under the data dir's secrets.key, and is opened only for
the admin-only watch feed (``opened``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from agent_reach.signing import signing_key

from auth.kek import SECRETS_KEY_FILE, SecretsKeyError, load_kek
from auth.records import (
    ADMIN_KEY,
    AdminRecord,
    ClientBudget,
    ClientCreate,
    ClientRecord,
    ClientSecrets,
    ClientView,
    IssuedToken,
    PublishedKey,
    TokenCreate,
    TokenRecord,
    TokenView,
    client_key,
    client_view,
    published_key_key,
    token_key,
    token_view,
)
from auth.sealing import SealError, seal, unseal
from auth.secrets import (
    ADMIN_KEY_PREFIX,
    API_KEY_PREFIX,
    CLIENT_SECRET_PREFIX,
    REGISTRATION_TOKEN_PREFIX,
    digest,
    new_id,
    new_secret,
)
from mesh.records import encode_value
from registry.budgets import check_budget
from registry.state import RegistryState
from registry.store import Store
from wal.private import write_private
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.access")

ADMIN_KEY_FILE = "admin.key"
# Writes of one client update refused because other registry nodes kept writing the record: then a 409.
CLIENT_WRITE_TRIES = 5


def admin_key_path(data_dir: Path) -> Path:
    return data_dir / ADMIN_KEY_FILE


def read_admin_key(data_dir: Path) -> str | None:
    """The key stored in the data dir, or None when there is none (or it cannot be read)."""
    try:
        key = admin_key_path(data_dir).read_text().strip()
    except OSError:
        return None
    return key or None


class Access:
    def __init__(self, store: Store, state: RegistryState, wall_clock: Callable[[], float] = time.time):
        self.store = store
        self.book = state.auth
        self._wall_clock = wall_clock
        # The key-encryption key, loaded by ensure_secrets at start before any token is written or fed.
        self._kek: bytes | None = None
        # Client updates one at a time in this process: each reads the record the one before it wrote.
        self._client_writes = asyncio.Lock()

    async def create_client(self, request: ClientCreate) -> ClientSecrets:
        check_budget(request.budget_tokens, request.budget_cost, request.budget_period)
        client_id = new_id("cli_")
        secret, api_key = new_secret(CLIENT_SECRET_PREFIX), new_secret(API_KEY_PREFIX)
        record = ClientRecord(client_id=client_id, name=request.name, trust_level=request.trust_level,
                              grants=list(dict.fromkeys(request.grants)), secret_digest=digest(secret),
                              api_key_digest=digest(api_key), created_at=self._wall_clock(),
                              rate_limit_qps=request.rate_limit_qps, budget_tokens=request.budget_tokens,
                              budget_cost=request.budget_cost, budget_period=request.budget_period)
        await self.store.put(client_key(client_id), encode_value(record))
        log.info("client created", extra={"client_id": client_id, "client_name": record.name,
                                          "trust_level": record.trust_level, "grants": record.grants})
        return _secrets(record, secret, api_key)

    def client(self, client_id: str) -> ClientRecord:
        record = self.book.clients.get(client_id)
        if record is None:
            raise ApiError(404, "client_not_found", f"No client {client_id!r}", "client_id")
        return record

    async def known_client(self, client_id: str) -> ClientRecord:
        """The client, looked up in the store first when this node has not heard of it: another registry node
        may have created it a moment ago, and its caller may ask here next."""
        if client_id not in self.book.clients:
            await self.store.caught_up(client_key(client_id))
        return self.client(client_id)

    def clients(self) -> list[ClientView]:
        return [client_view(record) for record in self.book.clients.values()]

    async def _update_client(self, client_id: str, change: Callable[[ClientRecord], ClientRecord]) -> ClientRecord:
        """Read, change and write one client record as one step, so two updates made at once both hold: one at
        a time in this process (memory learns a write only once the log committed it), and a compare-and-set
        in the store across registry nodes sharing etcd, made again on the newer record when another node
        wrote it first (CLIENT_WRITE_TRIES times)."""
        key = client_key(client_id)
        async with self._client_writes:
            await self.known_client(client_id)
            for _ in range(CLIENT_WRITE_TRIES):
                since = self.store.revision
                record = change(self.client(client_id))
                if await self.store.put_if_unchanged(key, encode_value(record), since, [key]) is not None:
                    return record
        raise ApiError(409, "client_changed", f"Client {client_id!r} kept changing at other registry nodes while "
                       "this update was being written; nothing was changed by it: try again", "client_id")

    async def set_enabled(self, client_id: str, enabled: bool) -> ClientView:
        record = await self._update_client(client_id, lambda record: msgspec.structs.replace(record, enabled=enabled))
        log.warning("client %s", "enabled" if enabled else "disabled", extra={"client_id": client_id})
        return client_view(record)

    async def rotate(self, client_id: str) -> ClientSecrets:
        """New secret and API key; the old ones stop working at once (tokens already issued run out)."""
        secret, api_key = new_secret(CLIENT_SECRET_PREFIX), new_secret(API_KEY_PREFIX)
        record = await self._update_client(client_id, lambda record: msgspec.structs.replace(
            record, secret_digest=digest(secret), api_key_digest=digest(api_key), rotated_at=self._wall_clock()))
        log.warning("client credentials rotated", extra={"client_id": client_id})
        return _secrets(record, secret, api_key)

    async def set_budget(self, client_id: str, budget: ClientBudget) -> ClientView:
        """The client's whole budget replaced (none given: removed); its account for the period is kept."""
        check_budget(budget.budget_tokens, budget.budget_cost, budget.budget_period)
        record = await self._update_client(client_id, lambda record: msgspec.structs.replace(
            record, budget_tokens=budget.budget_tokens, budget_cost=budget.budget_cost,
            budget_period=budget.budget_period))
        log.warning("client budget set", extra={"client_id": client_id, "budget_tokens": budget.budget_tokens,
                                                "budget_cost": budget.budget_cost, "period": budget.budget_period})
        return client_view(record)

    async def create_token(self, request: TokenCreate) -> IssuedToken:
        token = new_secret(REGISTRATION_TOKEN_PREFIX)
        record = TokenRecord(token_id=new_id("tok_"), service=request.service, token_digest=digest(token),
                             signing_key=signing_key(token), created_at=self._wall_clock())
        await self._store_token(record)
        log.info("registration token created", extra={"token_id": record.token_id, "service": record.service})
        return IssuedToken(token=token, token_id=record.token_id, service=record.service,
                           created_at=record.created_at)

    def tokens(self) -> list[TokenView]:
        return [token_view(record) for record in self.book.tokens.values()]

    async def revoke_token(self, token_id: str) -> TokenView:
        record = self.book.tokens.get(token_id)
        if record is None:
            raise ApiError(404, "token_not_found", f"No registration token {token_id!r}", "token_id")
        revoked = msgspec.structs.replace(record, revoked=True)
        await self._store_token(revoked)
        log.warning("registration token revoked", extra={"token_id": token_id, "service": record.service})
        return token_view(revoked)

    async def _store_token(self, record: TokenRecord) -> None:
        """The one way a token reaches the log: its signing key sealed, never in the clear."""
        if record.signing_key is not None:
            record = msgspec.structs.replace(record, signing_key=None,
                                             sealed_key=seal(self._secrets_key(), record.token_id, record.signing_key))
        await self.store.put(token_key(record.token_id), encode_value(record))

    def _secrets_key(self) -> bytes:
        if self._kek is None:
            raise RuntimeError("ensure_secrets() must run before tokens are written or fed")
        return self._kek

    def node_key(self) -> bytes:
        """What registry nodes sign their node-to-node messages with (registry/gossip.py): derived from
        secrets.key, which every node of a cluster shares already, so it opens nothing else."""
        return hmac.new(self._secrets_key(), b"agentreach node-to-node v1", hashlib.sha256).digest()

    def ensure_secrets(self, data_dir: Path) -> None:
        """Load the key-encryption key (made on first start) and check that it opens every sealed
        signing key. Raises SecretsKeyError (the registry refuses to start) rather than run with keys
        it cannot open: routers would sign nothing, and every token-holding agent refuse its calls."""
        self._kek = load_kek(data_dir)
        for record in self.book.tokens.values():
            if record.sealed_key is not None:
                try:
                    unseal(self._kek, record.token_id, record.sealed_key)
                except SealError as exc:
                    raise SecretsKeyError(f"{data_dir / SECRETS_KEY_FILE}: {exc}; restore the {SECRETS_KEY_FILE} "
                                          "this data dir was written with") from exc

    async def reseal_clear_keys(self) -> int:
        """Rewrite, sealed, the tokens whose signing key a previous version stored in the clear; how many."""
        clear = [record for record in self.book.tokens.values() if record.signing_key is not None]
        for record in clear:
            await self._store_token(record)
        if clear:
            log.warning("signing keys stored in the clear by a previous version resealed",
                        extra={"tokens": [record.token_id for record in clear]})
        return len(clear)

    def opened(self, value: object) -> object:
        """A stored record as the admin-only watch feed carries it: a token's signing key in the clear,
        for routers to sign with."""
        if isinstance(value, TokenRecord) and value.sealed_key is not None:
            return msgspec.structs.replace(value, sealed_key=None,
                                           signing_key=unseal(self._secrets_key(), value.token_id, value.sealed_key))
        return value

    async def publish_keys(self, keys: list[PublishedKey]) -> None:
        """Store routers' verifying keys; one already stored as given is not written again."""
        for key in keys:
            if self.book.published_keys.get(key.kid) != key:
                await self.store.put(published_key_key(key.kid), encode_value(key))
                log.info("token verifying key published", extra={"kid": key.kid, "verify_until": key.verify_until})

    async def ensure_admin_key(self, data_dir: Path, *, shared: bool = False) -> str | None:
        """Create the admin key on first start: stored as ``<data_dir>/admin.key`` (0600), its digest in
        the store. Returns the new key to print once, or None when one exists already.

        With its own log, a key file without its record (a wiped WAL) is taken as the truth and its digest
        stored again. In a ``shared`` store (etcd) the stored digest is the cluster's truth: a node joining
        with no key file, or an old one, must not replace every node's admin key with its own.
        """
        key = read_admin_key(data_dir)
        if shared:
            return await self._ensure_shared_admin_key(data_dir, key)
        stored = self.book.admin
        if key is not None:
            if stored is None or stored.key_digest != digest(key):
                await self._store_admin(key)
            return None
        return await self.rotate_admin_key(data_dir)

    async def _ensure_shared_admin_key(self, data_dir: Path, key: str | None) -> str | None:
        """While the cluster has no admin key, every node starting races to create its digest (create-if-absent:
        one winner however many start at once) with its key file's key, or one it mints. A minted key reaches
        the data dir only once its digest won: a loser prints no key and leaves no admin.key that opens nothing
        (nodes sharing one data dir keep the winner's). A winner that cannot write its file withdraws the
        digest, so that no key stays stored that nobody holds."""
        path = admin_key_path(data_dir)
        candidate = key or new_secret(ADMIN_KEY_PREFIX)
        while self.book.admin is None:
            if await self.store.put_if_unchanged(ADMIN_KEY, self._admin_record(candidate), self.store.revision,
                                                 [ADMIN_KEY]) is None:
                continue  # memory holds what another node stored meanwhile
            if key is not None:
                return None
            try:
                write_private(path, (candidate + "\n").encode(), replace=True)
            except OSError:
                await self.store.delete(ADMIN_KEY)
                raise
            log.warning("admin key written", extra={"path": str(path)})
            return candidate
        if key is None:
            log.warning("another registry node created the cluster's admin key; this node has no copy of admin.key "
                        "(copy it from the node that printed the key to rotate the key through this node's data dir)",
                        extra={"path": str(path)})
        elif self.book.admin.key_digest != digest(key):
            log.error("admin.key here is not the cluster's admin key (rotated elsewhere?); it is ignored",
                      extra={"path": str(path)})
        return None

    async def rotate_admin_key(self, data_dir: Path) -> str:
        """A new admin key: the file first (written aside, fsynced, renamed over), then its digest in
        the WAL. A crash in between leaves the new file, which wins at the next start."""
        key = new_secret(ADMIN_KEY_PREFIX)
        path = admin_key_path(data_dir)
        write_private(path, (key + "\n").encode(), replace=True)
        await self._store_admin(key)
        log.warning("admin key written", extra={"path": str(path)})
        return key

    def _admin_record(self, key: str) -> bytes:
        return encode_value(AdminRecord(key_digest=digest(key), created_at=self._wall_clock()))

    async def _store_admin(self, key: str) -> None:
        await self.store.put(ADMIN_KEY, self._admin_record(key))


def _secrets(record: ClientRecord, secret: str, api_key: str) -> ClientSecrets:
    return ClientSecrets(client_id=record.client_id, client_secret=secret, api_key=api_key, name=record.name,
                         trust_level=record.trust_level, grants=record.grants)

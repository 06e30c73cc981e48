"""Operators' sign-in to the console with the admin key.

A browser signs in once (POST /api/session with the key) and gets an HttpOnly, SameSite=Strict
cookie holding a random session id, never the key: page scripts cannot read it, other sites
cannot send it, and the server-sent event stream (EventSource cannot set headers) carries it.
Scripts may send the key itself as X-API-Key or Authorization: Bearer instead. Sessions live in
memory: a console restart signs everyone out, and so does a rotation of the admin key
(console/admin_key.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

import msgspec
from agent_reach import peer_json
from aiohttp import web
from aiohttp.typedefs import Handler

from auth.headers import presented_key
from console.admin_key import AdminKey, could_be_admin_key
from console.upstream import Upstream, credential
from weblayer.errors import ApiError
from weblayer.guard import require_admin
from weblayer.responses import json_response

log = logging.getLogger("agentreach.console.signin")

COOKIE = "agentreach_console"
SESSION_SECONDS = 12 * 3600
# Reachable without signing in: the page shell and its code, the sign-in endpoint itself, and
# health, metrics and the OpenAPI document (open on every part of the mesh, for probes, scrapers and tools).
OPEN_PATHS = ("/", "/api/session", "/healthz", "/metrics", "/openapi.json")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Tells the page this is the console asking for sign-in, not an upstream refusal it relays.
SIGN_IN_REQUIRED = {"X-Console-Sign-In": "required"}


class SignIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    admin_key: str


_decoder = peer_json.Decoder(SignIn)


class Sessions:
    """Signed-in browsers: session id → (expiry in monotonic seconds, the admin key's generation
    it was opened under); a session outlives neither."""

    def __init__(self, admin: AdminKey, ttl: float = SESSION_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.admin = admin
        self._ttl = ttl
        self._clock = clock
        self._expiry: dict[str, tuple[float, int]] = {}

    def _live(self, entry: tuple[float, int] | None, now: float) -> bool:
        return entry is not None and entry[0] > now and entry[1] == self.admin.generation

    def open(self) -> str:
        now = self._clock()
        self._expiry = {sid: entry for sid, entry in self._expiry.items() if self._live(entry, now)}
        session_id = secrets.token_urlsafe(32)
        self._expiry[session_id] = (now + self._ttl, self.admin.generation)
        return session_id

    def count(self) -> int:
        now = self._clock()
        return sum(self._live(entry, now) for entry in self._expiry.values())

    def valid(self, session_id: str | None) -> bool:
        return session_id is not None and self._live(self._expiry.get(session_id), self._clock())

    def close(self, session_id: str | None) -> None:
        if session_id is not None:
            self._expiry.pop(session_id, None)


def same_origin(request: web.Request) -> bool:
    """A cookie-carrying change must come from the console's own page: SameSite treats every port
    of 127.0.0.1 as one site, so an agent's page on another port could otherwise post here."""
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


class Gatekeeper:
    """The console's sign-in endpoints and the middleware that guards everything else."""

    def __init__(self, sessions: Sessions | None, registry: Upstream):
        self.sessions = sessions  # None: auth is off
        self.registry = registry
        self._asking = asyncio.Lock()  # one question to the registry at a time, however many guesses arrive

    async def is_admin(self, key: str) -> bool:
        """The console's admin key, or a key the registry accepts as its admin key (a rotation the
        console has not noticed yet, or the key it lost track of): then the console takes it."""
        assert self.sessions is not None
        admin = self.sessions.admin
        if admin.is_admin(key):
            return True
        if not could_be_admin_key(key):
            return False
        async with self._asking:
            if admin.is_admin(key):
                return True
            reply = await self.registry.request("GET", "/settings/alerts", headers=credential(key))
            if reply.ok:
                admin.accepted(key)
            return reply.ok

    async def signed_in(self, request: web.Request) -> bool:
        if self.sessions is None:
            return True
        key = presented_key(request.headers)
        if key is not None:
            return await self.is_admin(key)
        return self.sessions.valid(request.cookies.get(COOKIE)) and (
            request.method in SAFE_METHODS or same_origin(request))

    async def refusal(self, request: web.Request) -> ApiError | None:
        """The console's check for the admin-only guard: a signed-in browser or the admin key."""
        if await self.signed_in(request):
            return None
        return ApiError(401, "unauthenticated",
                        "Sign in with the admin key (or send it as X-API-Key or Authorization: Bearer)",
                        "Authorization", headers=SIGN_IN_REQUIRED)

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.sessions is not None and request.path not in OPEN_PATHS and not request.path.startswith("/static/"):
            await require_admin(request, self.refusal)
        return await handler(request)

    async def state(self, request: web.Request) -> web.Response:
        return json_response({"auth": "off" if self.sessions is None else "on",
                                  "signed_in": await self.signed_in(request)})

    async def sign_in(self, request: web.Request) -> web.Response:
        if self.sessions is None:
            return json_response({"auth": "off", "signed_in": True})
        if not same_origin(request):
            raise ApiError(403, "forbidden", "Sign in from the console's own page", "Origin")
        try:
            key = _decoder.decode(await request.read()).admin_key.strip()
        except msgspec.MsgspecError:
            raise ApiError(400, "invalid_body", 'Send {"admin_key": "..."}', "admin_key") from None
        if not key or not await self.is_admin(key):
            log.warning("console sign-in refused: not the admin key", extra={"remote": request.remote})
            raise ApiError(401, "unauthenticated", "That is not the admin key. It is in DATA_DIR/admin.key on the "
                                                   "registry's host.", "admin_key")
        response = json_response({"auth": "on", "signed_in": True})
        response.set_cookie(COOKIE, self.sessions.open(), max_age=SESSION_SECONDS, path="/", httponly=True,
                            samesite="Strict")
        log.info("console sign-in", extra={"remote": request.remote})
        return response

    async def sign_out(self, request: web.Request) -> web.Response:
        if self.sessions is not None:
            self.sessions.close(request.cookies.get(COOKIE))
        response = json_response({"auth": "off" if self.sessions is None else "on",
                                  "signed_in": self.sessions is None})
        response.del_cookie(COOKIE, path="/")
        return response

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/session", self.state)
        app.router.add_post("/api/session", self.sign_in)
        app.router.add_delete("/api/session", self.sign_out)

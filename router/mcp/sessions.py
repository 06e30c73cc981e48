"""MCP sessions: what ``initialize`` began, for whom, at which protocol version.

A session holds no calls and no credentials: every request is authenticated anew (tokens expire, keys
are rotated), and a request naming a session must come from the client that began it, else the session
is unknown to it (404, as the spec says of an ended one). Requests naming none are served too (stateless
clients). Sessions idle past ``IDLE_SECONDS`` end; past ``MAX_SESSIONS`` the least recently used one does.
A session whose stream is open (GET /mcp) is touched at each of the stream's wake-ups, so it stays; a session
that ends sets ``ended``, which closes its stream.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict

import msgspec

MAX_SESSIONS = 10_000
IDLE_SECONDS = 3600.0


class Session(msgspec.Struct, kw_only=True):
    owner: str | None  # the client id that began it; None with authentication off
    protocol_version: str
    seen: float
    streaming: bool = False  # its GET stream is open (one per session)
    ended: asyncio.Event = msgspec.field(default_factory=asyncio.Event)


class Sessions:
    def __init__(self, max_sessions: int = MAX_SESSIONS, idle_seconds: float = IDLE_SECONDS):
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def streaming(self) -> int:
        """How many sessions have their stream open."""
        return sum(session.streaming for session in self._sessions.values())

    def streaming_for(self, owner: str) -> int:
        return sum(session.streaming and session.owner == owner for session in self._sessions.values())

    def begin(self, owner: str | None, protocol_version: str) -> str:
        self._expire(time.monotonic())
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)[1].ended.set()
        session_id = secrets.token_urlsafe(24)
        self._sessions[session_id] = Session(owner=owner, protocol_version=protocol_version, seen=time.monotonic())
        return session_id

    def find(self, session_id: str, owner: str | None) -> Session | None:
        """The caller's live session of that id (touched), or None: unknown, ended, or another client's."""
        now = time.monotonic()
        self._expire(now)
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return None
        session.seen = now
        self._sessions.move_to_end(session_id)
        return session

    def end(self, session_id: str, owner: str | None) -> bool:
        if self.find(session_id, owner) is None:
            return False
        self._sessions.pop(session_id).ended.set()
        return True

    def _expire(self, now: float) -> None:
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.seen < self.idle_seconds:
                return
            self._sessions.popitem(last=False)[1].ended.set()

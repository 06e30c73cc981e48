"""The debug entry's own callers, so a signed-in operator can try a capability without pasting a
client's key.

One client per capability, named "console debug", granted that capability alone, at internal trust:
the router checks its calls like anyone's and the audit trail names it. The console keeps the API
key in memory only; after a restart it finds its client again and rotates it for a fresh key, so
the registry holds one such client per capability however often the console starts. A key that
stops working (someone rotated the client, or another console did) is dropped and a new one taken.
"""

from __future__ import annotations

import asyncio

import msgspec

from console.upstream import Reply, Upstream

DEBUG_CLIENT_NAME = "console debug"
_encoder = msgspec.json.Encoder()


class DebugKey(msgspec.Struct, frozen=True):
    api_key: str
    fresh: bool  # just minted: routers may not have heard of it yet


class DebugCallers:
    def __init__(self, registry: Upstream):
        self.registry = registry
        self._keys: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def forget(self, capability: str, api_key: str) -> None:
        """The router refused ``api_key``: the next call takes a new one."""
        if self._keys.get(capability) == api_key:
            del self._keys[capability]

    async def key_for(self, capability: str) -> DebugKey | Reply:
        """The API key of the capability's test client, or the registry's refusal."""
        if capability in self._keys:
            return DebugKey(self._keys[capability], fresh=False)
        async with self._lock:
            if capability in self._keys:
                return DebugKey(self._keys[capability], fresh=False)
            listed = await self.registry.get("/clients")
            if not listed.ok:
                return listed
            mine = [client for client in listed.json()["clients"]
                    if client["name"] == DEBUG_CLIENT_NAME and client["grants"] == [capability]]
            if mine:
                reply = await self.registry.request("POST", f"/clients/{mine[0]['client_id']}/rotate")
            else:
                body = {"name": DEBUG_CLIENT_NAME, "trust_level": "internal", "grants": [capability]}
                reply = await self.registry.request("POST", "/clients", _encoder.encode(body))
            if not reply.ok:
                return reply
            self._keys[capability] = reply.json()["api_key"]
            return DebugKey(self._keys[capability], fresh=True)

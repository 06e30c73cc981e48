"""Learned examples at the registry: routers report confirmations, operators review (mesh/examples.py).

Acceptance is decided here, once, before the record is written, so every router indexes the same
verdict. A judge (semantic/judge.py, when the embed extra is installed) checks that the new
phrasing sends none of the mesh's labelled phrasings to a wrong capability; without one, acceptance
is unchecked and says so in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec

from mesh.examples import (
    EXAMPLE_PREFIX,
    MAX_EXAMPLES_PER_CAPABILITY,
    MAX_PENDING_PER_CALLER,
    Confirmation,
    ExampleSettings,
    ExampleSummary,
    ExampleView,
    HeardRule,
    LearnedExample,
    confirmed,
    due_for_acceptance,
    example_id,
    example_key,
    example_settings_key,
    example_view,
    loosest,
)
from mesh.keyspace import KeySpace
from mesh.records import encode_value
from registry.state import RegistryState
from registry.store import Store
from weblayer.errors import ApiError

log = logging.getLogger("agentreach.registry.examples")

# (the key space as stored, capability, phrasing, the routers' loosest rule or None for the model's own)
# -> why accepting it would route something wrongly, or None.
Judge = Callable[[KeySpace, str, str, HeardRule | None], Awaitable[str | None]]


class Examples:
    def __init__(self, store: Store, state: RegistryState, wall_clock: Callable[[], float]):
        self._store = store
        self._state = state
        self._wall_clock = wall_clock
        self.judge: Judge | None = None
        # The loosest threshold and margin routers reported with confirmations since this registry started:
        # an example must misroute nothing on any router, so it is checked with the most permissive rule.
        self.heard_rule: HeardRule | None = None
        # Read, change, write one example at a time: two confirmations of one phrasing both count.
        self._lock = asyncio.Lock()

    def _stored(self, capability: str) -> dict[str, LearnedExample]:
        return self._state.keys.examples.get(capability, {})

    def summary(self) -> list[ExampleSummary]:
        """Every capability with examples or example settings, its examples counted by state."""
        keys = self._state.keys
        found = []
        for capability in sorted(keys.examples.keys() | keys.example_settings.keys()):
            states = Counter(example.state for example in keys.examples.get(capability, {}).values())
            found.append(ExampleSummary(capability=capability, pending=states["pending"], accepted=states["accepted"],
                                        rejected=states["rejected"],
                                        auto_accept_at=self.settings(capability).auto_accept_at))
        return found

    def list(self, capability: str) -> list[ExampleView]:
        stored = self._stored(capability)
        return sorted((example_view(i, e) for i, e in stored.items()), key=lambda view: view.text)

    def _get(self, capability: str, identifier: str) -> LearnedExample:
        example = self._stored(capability).get(identifier)
        if example is None:
            raise ApiError(404, "example_not_found", f"No example {identifier!r} for {capability!r}", "id")
        return example

    def _check_room(self, capability: str) -> None:
        if len(self._stored(capability)) >= MAX_EXAMPLES_PER_CAPABILITY:
            raise ApiError(409, "examples_full", f"{capability!r} holds {MAX_EXAMPLES_PER_CAPABILITY} examples, "
                           "the most kept per capability: delete some first", "text")

    def _no_room_for(self, capability: str, caller: str) -> str | None:
        """Why a new phrasing confirmed by ``caller`` is not kept, if it is not."""
        stored = self._stored(capability).values()
        if len(stored) >= MAX_EXAMPLES_PER_CAPABILITY:
            return "examples full"
        alone = sum(example.state == "pending" and example.confirmed_by == [caller] for example in stored)
        return "the caller's own pending phrasings are at the limit" if alone >= MAX_PENDING_PER_CALLER else None

    async def _write(self, capability: str, identifier: str, example: LearnedExample) -> ExampleView:
        # Another registry node may have written this capability's examples since memory was read: retry then.
        while True:
            since = self._store.revision
            prefix = f"{EXAMPLE_PREFIX}{capability}/"
            if await self._store.put_if_unchanged(example_key(capability, identifier), encode_value(example),
                                                  since, [prefix]) is not None:
                return example_view(identifier, example)

    async def _judged(self, example: LearnedExample) -> LearnedExample:
        """Accepted, or rejected naming what it would send astray."""
        reason = await self.judge(self._state.keys, example.capability, example.text, self.heard_rule) \
            if self.judge else None
        if self.judge is None:
            log.warning("example accepted unchecked: no embedding model at this registry",
                        extra={"capability": example.capability})
        state = "rejected" if reason else "accepted"
        log.info("example judged", extra={"capability": example.capability, "state": state, "reason": reason})
        return msgspec.structs.replace(example, state=state, reason=reason)

    async def add(self, capability: str, text: str) -> ExampleView:
        """An operator's phrasing: accepted at once unless it would route something wrongly."""
        async with self._lock:
            identifier = example_id(text)
            if identifier not in self._stored(capability):
                self._check_room(capability)
            example = LearnedExample(capability=capability, text=text.strip(), state="pending", source="operator",
                                     created_at=self._wall_clock())
            return await self._write(capability, identifier, await self._judged(example))

    async def confirm(self, capability: str, confirmation: Confirmation) -> ExampleView | None:
        """A caller confirmed its intent meant ``capability``: counted once per distinct caller; None when a
        new phrasing is not kept (no room left, or this caller alone already has its share pending). A router
        reports these (in process or over HTTP)."""
        text, caller = confirmation.text, confirmation.caller
        self.heard_rule = loosest(self.heard_rule, confirmation)
        async with self._lock:
            identifier = example_id(text)
            example = self._stored(capability).get(identifier)
            if example is None:
                refusal = self._no_room_for(capability, caller)
                if refusal is not None:
                    log.info("confirmation not kept", extra={"capability": capability, "reason": refusal})
                    return None
                example = LearnedExample(capability=capability, text=text.strip(), state="pending",
                                         source="confirmed", created_at=self._wall_clock())
            counted = confirmed(example, caller)
            if counted is example and identifier in self._stored(capability):
                return example_view(identifier, example)
            if due_for_acceptance(counted, self._state.keys.example_settings.get(capability)):
                counted = await self._judged(counted)
            return await self._write(capability, identifier, counted)

    async def accept(self, capability: str, identifier: str) -> ExampleView:
        async with self._lock:
            example = self._get(capability, identifier)
            return await self._write(capability, identifier, await self._judged(example))

    async def reject(self, capability: str, identifier: str, reason: str | None) -> ExampleView:
        async with self._lock:
            example = self._get(capability, identifier)
            rejected = msgspec.structs.replace(example, state="rejected", reason=reason or "rejected by an operator")
            log.info("example rejected", extra={"capability": capability, "reason": rejected.reason})
            return await self._write(capability, identifier, rejected)

    async def delete(self, capability: str, identifier: str) -> None:
        async with self._lock:
            self._get(capability, identifier)
            await self._store.delete(example_key(capability, identifier))

    def settings(self, capability: str) -> ExampleSettings:
        return self._state.keys.example_settings.get(capability, ExampleSettings())

    async def put_settings(self, capability: str, settings: ExampleSettings) -> ExampleSettings:
        await self._store.put(example_settings_key(capability), encode_value(settings))
        log.info("example settings saved", extra={"capability": capability, "auto_accept_at": settings.auto_accept_at})
        return settings

"""``context.routing_hint``, the caller's hard filter: which instances it admits, and why none did.

One definition for the router's selection and the SDK's direct fallback, so an instance the router
would never route a call to is never called directly either (a staging caller never reaches production).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def matches_hint(metadata: Mapping[str, Any], routing_hint: Mapping[str, Any]) -> bool:
    """The instance's metadata has every hinted label with exactly the hinted value: JSON's ``true`` is not the
    number 1, though Python's ``True == 1`` says so (the Go SDK, and any JSON reader, tells them apart)."""
    return all(_same(metadata.get(label, _MISSING), value) for label, value in routing_hint.items())


def _same(held: Any, hinted: Any) -> bool:
    return held == hinted and isinstance(held, bool) == isinstance(hinted, bool)


def unsatisfied_hint(routing_hint: Mapping[str, Any]) -> str:
    """The reason given with ROUTING_HINT_UNSATISFIABLE when no instance matches."""
    labels = ", ".join(f"{label}={value!r}" for label, value in routing_hint.items())
    return f"no instance has metadata matching routing_hint {labels}"

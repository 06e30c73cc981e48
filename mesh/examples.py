"""Learned examples: phrasings callers confirmed (or operators wrote) for a capability, as stored records.

The registry stores them like policies, so every router's mirror holds them; a router indexes only
the accepted ones. One record per (capability, phrasing): the key's id is a digest of the phrasing
with spacing and case folded, so the same words confirmed again count on the same record.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec

EXAMPLE_PREFIX = "examples/"
EXAMPLE_SETTINGS_PREFIX = "example-settings/"
# Every example of one capability, any state: rejected ones are kept so the same words stay rejected.
MAX_EXAMPLES_PER_CAPABILITY = 200
# New phrasings one caller alone may have pending per capability: one caller cannot fill the bound.
MAX_PENDING_PER_CALLER = 10
# As long as an intent may be (router/api.py MAX_INTENT_CHARS): any confirmed intent fits.
MAX_EXAMPLE_CHARS = 1024
# Distinct callers remembered per example; auto-acceptance can ask for at most this many.
MAX_CONFIRMERS = 64

ExampleState = Literal["pending", "accepted", "rejected"]
ExampleSource = Literal["confirmed", "operator"]
ExampleText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EXAMPLE_CHARS)]


class LearnedExample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One phrasing of one capability. A stored format (mesh/records.py): change only with a migration."""

    capability: str
    text: str
    state: ExampleState
    source: ExampleSource
    # The distinct callers (client ids; "anonymous" with auth off) that confirmed it, first MAX_CONFIRMERS.
    confirmed_by: list[str] = []
    created_at: float = 0.0
    # Why it was rejected: the operator's words, or the evaluation intent it would have sent astray.
    reason: str | None = None


class ExampleSettings(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Per capability: accept a confirmed phrasing by itself once this many distinct callers confirmed it."""

    auto_accept_at: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONFIRMERS)] | None = None


class ExampleView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the admin API shows of an example."""

    id: str
    text: str
    state: ExampleState
    confirmations: int
    source: ExampleSource
    reason: str | None = None


class ExampleSummary(msgspec.Struct, kw_only=True):
    """One capability's examples counted by state, for a review queue."""

    capability: str
    pending: int = 0
    accepted: int = 0
    rejected: int = 0
    auto_accept_at: int | None = None


class NewExample(msgspec.Struct, forbid_unknown_fields=True):
    text: ExampleText


class Rejection(msgspec.Struct, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class Confirmation(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A router's report: ``caller`` confirmed that ``text`` meant the capability it was routed to.

    With the threshold and margin the router matches intents with (none when it does not match them):
    acceptance checks an example with the loosest rule any router reported.
    """

    text: ExampleText
    caller: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    threshold: Annotated[float, msgspec.Meta(ge=-1.0, le=1.0)] | None = None
    margin: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None


class HeardRule(msgspec.Struct, frozen=True):
    """The loosest threshold and margin the routers reported: an example must misroute nothing on any of them."""

    threshold: float
    margin: float


def loosest(heard: HeardRule | None, confirmation: Confirmation) -> HeardRule | None:
    """``heard`` loosened by the rule ``confirmation`` carries, if it carries one."""
    if confirmation.threshold is None or confirmation.margin is None:
        return heard
    if heard is None:
        return HeardRule(confirmation.threshold, confirmation.margin)
    return HeardRule(min(heard.threshold, confirmation.threshold), min(heard.margin, confirmation.margin))


def phrasing(text: str) -> str:
    """The words as compared: spacing and case carry no meaning."""
    return " ".join(text.split()).casefold()


def example_id(text: str) -> str:
    return hashlib.blake2b(phrasing(text).encode(), digest_size=8).hexdigest()


def example_key(capability: str, identifier: str) -> str:
    return f"{EXAMPLE_PREFIX}{capability}/{identifier}"


def example_settings_key(capability: str) -> str:
    return EXAMPLE_SETTINGS_PREFIX + capability


def split_example_key(key: str) -> tuple[str, str]:
    """(capability, id) of an example key (capability names hold no '/')."""
    capability, _, identifier = key[len(EXAMPLE_PREFIX):].rpartition("/")
    return capability, identifier


def example_view(identifier: str, example: LearnedExample) -> ExampleView:
    return ExampleView(id=identifier, text=example.text, state=example.state, confirmations=len(example.confirmed_by),
                       source=example.source, reason=example.reason)


def confirmed(example: LearnedExample, caller: str) -> LearnedExample:
    """The example with ``caller`` counted once more, if it is a new caller and there is room."""
    if caller in example.confirmed_by or len(example.confirmed_by) >= MAX_CONFIRMERS:
        return example
    return msgspec.structs.replace(example, confirmed_by=[*example.confirmed_by, caller])


def due_for_acceptance(example: LearnedExample, settings: ExampleSettings | None) -> bool:
    """Pending, and confirmed by as many distinct callers as the capability's setting asks for."""
    return (example.state == "pending" and settings is not None and settings.auto_accept_at is not None
            and len(example.confirmed_by) >= settings.auto_accept_at)

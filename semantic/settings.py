"""Semantic matching configuration. Importing it needs no embedding extra, so router config can."""

from __future__ import annotations

import msgspec


class SemanticUnavailable(RuntimeError):
    """Semantic matching was asked for but the `embed` extra is not installed."""


class SemanticSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Off unless enabled; threshold and margin default to the values calibrated for the model."""

    enabled: bool = False
    model: str | None = None
    threshold: float | None = None
    margin: float | None = None
    # Past this many described capabilities, confusable neighbours multiply and the router goes
    # exact-only (the seed: about 50). The evaluation set has 52, with no wrong route.
    max_capabilities: int = 64
    cache_size: int = 10_000
    top_k: int = 3
    # An operator's own model (a local directory, semantic/local_model.py): asked only about the intents
    # the shipped model refuses as matching nothing; ``embed_prompt`` goes before every text it embeds.
    embed_model: str | None = None
    embed_prompt: str = ""

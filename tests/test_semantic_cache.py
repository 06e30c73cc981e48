"""The intent-embedding cache: least recently used goes first; spacing does not split entries."""

from __future__ import annotations

from semantic.cache import LruCache, intent_key


def test_evicts_least_recently_used_and_counts_hits() -> None:
    cache: LruCache[int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None
    assert cache.get("a") == 1 and cache.get("c") == 3
    assert (cache.hits, cache.misses, len(cache)) == (3, 1, 2)


def test_zero_size_caches_nothing() -> None:
    cache: LruCache[int] = LruCache(0)
    cache.put("a", 1)
    assert cache.get("a") is None and len(cache) == 0


def test_intent_key_ignores_spacing_only() -> None:
    assert intent_key("  where is   my order\n") == intent_key("where is my order")
    assert intent_key("Where is my order") != intent_key("where is my order")

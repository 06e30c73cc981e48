"""Consistent hashing: a key keeps its node, and a membership change moves only that node's keys."""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable


def stable_hash(text: str) -> int:
    """The same 64-bit value in every process (unlike ``hash``, which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Each node owns ``replicas`` points on a 64-bit ring; a key belongs to the next point clockwise.

    A node's points depend only on its own name, so the preference order of a subset of nodes is
    the full preference order with the others left out.
    """

    def __init__(self, nodes: Iterable[str], replicas: int = 160):
        self._nodes = frozenset(nodes)
        points = sorted((stable_hash(f"{node}#{replica}"), node) for node in self._nodes for replica in range(replicas))
        self._points = [point for point, _ in points]
        self._owners = [node for _, node in points]

    @property
    def nodes(self) -> frozenset[str]:
        return self._nodes

    def lookup(self, key: str) -> str | None:
        """The node that owns ``key``, or None on an empty ring."""
        if not self._points:
            return None
        return self._owners[bisect_right(self._points, stable_hash(key)) % len(self._points)]

    def preference(self, key: str) -> list[str]:
        """Every node once, in ring order from ``key``'s point: the owner first, then the failover order."""
        if not self._points:
            return []
        start = bisect_right(self._points, stable_hash(key))
        order: dict[str, None] = {}
        for offset in range(len(self._owners)):
            order.setdefault(self._owners[(start + offset) % len(self._owners)])
            if len(order) == len(self._nodes):
                break
        return list(order)

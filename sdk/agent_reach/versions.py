"""Capability versions and the constraints callers, rules and canary splits put on them.

A small grammar rather than a library: PEP 440 specifiers (``packaging``) have no ``^``/``~`` and read
``3.2`` as ``3.2.0`` exactly, while operators write npm-style ranges. Accepted, comparators joined by
``,`` or spaces (all must hold): ``3.2.1`` (exactly), ``3.2`` / ``3`` / ``3.x`` / ``*`` (any patch, any
minor, anything), ``>=3.2``, ``>3``, ``<=3.2.1``, ``<4``, ``=3.2.1``, ``^3.2`` (same major, at least
3.2), ``~3.2`` (same minor, at least 3.2.0). Pre-release tags order before their release
(``3.3.0-rc.1 < 3.3.0``). Parsing is cached: the same few constraints are checked on every call.
"""

from __future__ import annotations

import re
from functools import lru_cache

# (major, minor, patch, pre-release identifiers); a release's empty tuple sorts after any pre-release,
# so the fourth member is (1,) for a release and (0, identifiers...) for a pre-release.
Version = tuple[int, int, int, tuple[object, ...]]
Bound = tuple[Version, bool]  # a version and whether the bound admits it
# Every comparator of a constraint folded into one interval: (lower, upper), None for unbounded.
Interval = tuple[Bound | None, Bound | None]

_VERSION = re.compile(r"v?(\d{1,9})(?:\.(\d{1,9}|[xX*]))?(?:\.(\d{1,9}|[xX*]))?"
                      r"(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")
_COMPARATOR = re.compile(r"(>=|<=|>|<|==|=|\^|~)?\s*(\S+)")
_RELEASE: tuple[object, ...] = (1,)


class VersionError(ValueError):
    """A version or constraint that cannot be read, or one no version can satisfy."""


def _pre(tag: str | None) -> tuple[object, ...]:
    if not tag:
        return _RELEASE
    return (0, *((0, int(part)) if part.isdigit() else (1, part) for part in tag.split(".")))


def _parts(text: str) -> tuple[list[int], tuple[object, ...]] | None:
    """The numeric parts given (1 to 3; a wildcard ends them) and the pre-release order key."""
    text = text.strip()
    if text in ("*", "x", "X"):
        return [], _RELEASE
    found = _VERSION.fullmatch(text)
    if found is None:
        return None
    numbers: list[int] = []
    for part in found.group(1, 2, 3):
        if part is None or not part.isdigit():
            break
        numbers.append(int(part))
    return numbers, _pre(found.group(4))


@lru_cache(maxsize=4096)
def parse_version(text: str) -> Version | None:
    """A version an instance advertises; ``3.2`` reads as ``3.2.0``. None when it is not a version."""
    parts = _parts(text)
    if parts is None:
        return None
    numbers, pre = parts
    major, minor, patch = [*numbers, 0, 0, 0][:3]
    return major, minor, patch, pre


def _floor(numbers: list[int], pre: tuple[object, ...]) -> Version:
    major, minor, patch = [*numbers, 0, 0, 0][:3]
    return major, minor, patch, pre if len(numbers) == 3 else (0,)


def _next(numbers: list[int], position: int) -> Version:
    """The lowest version past every version sharing ``numbers[:position + 1]`` (its first pre-release)."""
    bumped = [*numbers[:position], numbers[position] + 1, 0, 0][:3]
    return bumped[0], bumped[1], bumped[2], (0,)


def _comparator(operator: str, numbers: list[int], pre: tuple[object, ...]) -> Interval:
    floor = _floor(numbers, pre)
    if not numbers:  # "*"
        return None, None
    if operator in ("", "=", "=="):
        if len(numbers) == 3:
            return (floor, True), (floor, True)
        return (floor, True), (_next(numbers, len(numbers) - 1), False)
    if operator == ">=":
        return (floor, True), None
    if operator == ">":
        return ((floor, False) if len(numbers) == 3 else (_next(numbers, len(numbers) - 1), True)), None
    if operator == "<":
        return None, (floor, False)
    if operator == "<=":
        return None, ((floor, True) if len(numbers) == 3 else (_next(numbers, len(numbers) - 1), False))
    if operator == "^":
        significant = next((i for i, n in enumerate(numbers) if n != 0), len(numbers) - 1)
        return (floor, True), (_next(numbers, significant), False)
    # "~": patch updates when the minor is given, minor updates when only the major is.
    return (floor, True), (_next(numbers, min(1, len(numbers) - 1)), False)


def _tighter(a: Bound | None, b: Bound | None, lower: bool) -> Bound | None:
    if a is None or b is None:
        return a or b
    if a[0] != b[0]:
        return max(a, b) if lower else min(a, b)
    return (a[0], a[1] and b[1])


@lru_cache(maxsize=1024)
def parse_constraint(text: str) -> Interval:
    """The interval a constraint admits; raises VersionError naming what is wrong, including a
    constraint no version satisfies (``>=4,<3``)."""
    lower: Bound | None = None
    upper: Bound | None = None
    tokens = [token for token in re.split(r"[,\s]+", text.strip()) if token]
    merged: list[str] = []
    for token in tokens:  # ">= 3.2" arrives as two tokens: join an operator to its version
        if merged and re.fullmatch(r"(>=|<=|>|<|==|=|\^|~)", merged[-1]):
            merged[-1] += token
        else:
            merged.append(token)
    if not merged:
        raise VersionError("a version constraint cannot be empty")
    for token in merged:
        found = _COMPARATOR.fullmatch(token)
        parts = _parts(found.group(2)) if found else None
        if found is None or parts is None:
            raise VersionError(f"{token!r} is not a version or a comparison with one (e.g. '>=3.2', '^3', '3.2.1')")
        low, high = _comparator(found.group(1) or "", *parts)
        lower, upper = _tighter(lower, low, lower=True), _tighter(upper, high, lower=False)
    if lower is not None and upper is not None and (lower[0] > upper[0] or (
            lower[0] == upper[0] and not (lower[1] and upper[1]))):
        raise VersionError(f"no version satisfies {text!r}")
    return lower, upper


DEFAULT_CAPABILITY_VERSION = "1.0"


def instance_version(declared: str, semver: object) -> str:
    """An instance's version of one capability: the capability's ``version``, unless it was left at the
    default and the instance's ``metadata.semver`` says more (one build, every capability it serves)."""
    if declared == DEFAULT_CAPABILITY_VERSION and isinstance(semver, str) and semver:
        return semver
    return declared


def satisfies(version: Version | None, interval: Interval) -> bool:
    """Whether an instance's version lies in the interval; an unreadable version satisfies only ``*``."""
    lower, upper = interval
    if version is None:
        return lower is None and upper is None
    if lower is not None and (version < lower[0] or (version == lower[0] and not lower[1])):
        return False
    return upper is None or version < upper[0] or (version == upper[0] and upper[1])


def overlap(first: str, second: str) -> bool:
    """Whether some version satisfies both constraints (both already valid)."""
    try:
        parse_constraint(f"{first},{second}")
    except VersionError:
        return False
    return True


MAX_CONSTRAINT_CHARS = 128


def check_constraint(text: str) -> str | None:
    """Why ``text`` is no usable constraint; None when it is one."""
    if len(text) > MAX_CONSTRAINT_CHARS:
        return f"a version constraint is at most {MAX_CONSTRAINT_CHARS} characters"
    try:
        parse_constraint(text)
    except VersionError as exc:
        return str(exc)
    return None

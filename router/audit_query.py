"""GET /audit's query string, checked into an AuditFilter: strict, so a misspelt filter is an error."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

from router.audit import DEFAULT_LIMIT, MAX_LIMIT, AuditFilter

_UNIX_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_LIMIT = re.compile(r"[0-9]{1,4}")
_TEXT_FIELDS = ("capability", "caller", "request_id", "trace_id")
KNOWN_FIELDS = frozenset((*_TEXT_FIELDS, "since", "until", "limit"))
MAX_TEXT = 256


class FilterError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def moment(field: str, raw: str) -> float:
    """Unix seconds from unix seconds or ISO 8601 with a UTC offset. Both are accepted because they
    cannot be confused (a bare number vs. a date); a local time without offset is refused as ambiguous."""
    if _UNIX_SECONDS.fullmatch(raw):
        return float(raw)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise FilterError(field, f"{field} must be unix seconds (e.g. 1714557600) or ISO 8601 with a UTC "
                                 f"offset (e.g. 2024-05-01T10:00:00Z), not {raw!r}")
    return parsed.timestamp()


def parse_filters(query: Mapping[str, str]) -> AuditFilter:
    """An AuditFilter from GET /audit's query string; FilterError names the first bad field.

    Unknown and repeated parameters are refused: a misspelt filter that silently matched
    everything would send an operator reading an incident down the wrong trail.
    """
    seen: set[str] = set()
    for name, _ in query.items():  # items(), not keys(): a MultiDict's keys() hides repeats
        if name not in KNOWN_FIELDS:
            raise FilterError(name, f"Unknown filter {name!r}; use {', '.join(sorted(KNOWN_FIELDS))}")
        if name in seen:
            raise FilterError(name, f"{name} is given more than once")
        seen.add(name)
    texts: dict[str, str] = {}
    for field in _TEXT_FIELDS:
        raw = query.get(field)
        if raw is not None:
            if not 0 < len(raw) <= MAX_TEXT:
                raise FilterError(field, f"{field} must be 1 to {MAX_TEXT} characters")
            texts[field] = raw
    since = moment("since", query["since"]) if "since" in query else None
    until = moment("until", query["until"]) if "until" in query else None
    if since is not None and until is not None and until < since:
        raise FilterError("until", "until must not be before since")
    limit = query.get("limit", str(DEFAULT_LIMIT))
    if not _LIMIT.fullmatch(limit) or not 1 <= int(limit) <= MAX_LIMIT:
        raise FilterError("limit", f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return AuditFilter(**texts, since=since, until=until, limit=int(limit))

"""When a capability's reach rate raises an alert: stored by the registry, read by every router.

The registry validates an operator's PUT with this schema and keeps it under ``settings/alerts``;
routers judge their reach ledgers by it (router/reach.py does the accounting).
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class AlertConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """When a capability's reach rate raises an alert; stored by the registry, editable live."""

    reach_threshold: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.98
    consecutive_periods: Annotated[int, msgspec.Meta(ge=1, le=1440)] = 2
    min_failures: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 50

"""A credential's grants compiled once (auth/grants.py GrantSet) decide exactly as the grants read one by
one: exact names, explicit prefixes (`order.*`), nothing else."""

from __future__ import annotations

import pytest

from auth.grants import GrantSet, granted, strictest


def one_by_one(grants: list[str], capability: str) -> bool:
    """The rule as the docs state it, grant by grant: the reference the compiled set is held to."""
    return any(capability.startswith(grant[:-1]) if grant.endswith(".*") else grant == capability
               for grant in grants)


GRANTS = [[], ["order.query"], ["order.*"], ["order.*", "billing.refund"], ["a.b.*", "a.*"], ["order.query", "x.*"]]
NAMES = ["order.query", "order.qps", "order", "orders.query", "order.", "billing.refund", "billing.refund2",
         "a.b.c", "a.c", "a", "x.", "x.y", "", "ORDER.query"]


@pytest.mark.parametrize("grants", GRANTS)
def test_the_compiled_set_decides_as_the_grants_read_one_by_one(grants):
    compiled = GrantSet(grants)
    for name in NAMES:
        assert compiled.covers(name) is one_by_one(grants, name), (grants, name)
        assert granted(grants, name) is one_by_one(grants, name), (grants, name)


def test_a_prefix_grant_covers_its_own_names_only():
    compiled = GrantSet(["order.*"])
    assert compiled.covers("order.query") and compiled.covers("order.a.b")
    assert not compiled.covers("order") and not compiled.covers("orders.query") and not compiled.covers("billing.x")


@pytest.mark.parametrize(("levels", "strictest_level"), [
    (["public"], "public"),
    (["public", "user_authorized"], "user_authorized"),
    (["public", None], "internal"),  # an instance that declares nothing requires the safest level
    (["user_authorized", "internal", "public"], "internal"),
    ([], "internal"),
])
def test_the_strictest_level_among_instances(levels, strictest_level):
    assert strictest(levels) == strictest_level

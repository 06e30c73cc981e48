"""Names end where they end: a trailing newline is not part of a valid name anywhere in the schema.

Python's ``$`` also matches before a final newline, so a pattern written with it took ``"echo\\n"`` as
an agent id or capability name; such a name could later reach an HTTP header (``X-Reach-Instance``).
"""

from __future__ import annotations

import msgspec
import pytest
from agent_reach.registration import Name

from auth.records import Grant, Kid, PublicX
from conftest import post, registration


@pytest.mark.parametrize(("kind", "good"), [(Name, "order.query"), (Grant, "order.*"),
                                       (Kid, "1700000000000-ab12"), (PublicX, "A" * 43)])
def test_a_trailing_newline_is_refused(kind, good):
    assert msgspec.convert(good, kind) == good
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(good + "\n", kind)


@pytest.mark.parametrize("field", ["agent_id", "service", "capability"])
async def test_registry_refuses_a_name_with_a_trailing_newline(registry, http, field):
    body = registration("a1", "good.cap", service="svc")
    if field == "capability":
        body["capabilities"][0]["name"] += "\n"
    else:
        body[field] += "\n"
    status, answer = await post(http, f"{registry.url}/register", body)
    assert status == 400, answer
    assert answer["error"] == "invalid_field"
    assert answer["field"] in (field, "capabilities[0].name")
    assert registry.store.wal.last_index == 0

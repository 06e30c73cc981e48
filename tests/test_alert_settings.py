"""Alert thresholds live in the registry (WAL), are validated, and reach routers within a second."""

from __future__ import annotations

import pytest

from conftest import wait_for
from mesh.alerts import AlertConfig

STRICT = {"reach_threshold": 0.9, "consecutive_periods": 3, "min_failures": 5}
DEFAULTS = {"reach_threshold": 0.98, "consecutive_periods": 2, "min_failures": 50}


async def test_thresholds_saved_replayed_and_applied_by_the_router(mesh, http):
    registry = mesh.registry
    async with http.get(f"{registry.url}/settings/alerts") as response:
        assert response.status == 200 and await response.json() == DEFAULTS
    async with http.put(f"{registry.url}/settings/alerts", json=STRICT) as response:
        assert response.status == 200 and await response.json() == STRICT
    assert registry.store.revision == 1
    await wait_for(lambda: mesh.router.ledger.alert_config == AlertConfig(**STRICT), timeout=3,
                   what="the router to apply the new thresholds")
    async with http.get(f"{mesh.url}/alerts") as response:
        assert (await response.json())["config"] == STRICT


@pytest.mark.parametrize(("body", "field"), [
    ({"reach_threshold": 1.5}, "reach_threshold"),
    ({"consecutive_periods": 0}, "consecutive_periods"),
    ({"min_failures": -1}, "min_failures"),
    ({"reach_threshold": "high"}, "reach_threshold"),
    ({"colour": 1}, "colour"),
])
async def test_bad_thresholds_are_rejected(registry, http, body, field):
    async with http.put(f"{registry.url}/settings/alerts", json=body) as response:
        answer = await response.json()
        assert response.status == 400 and answer["field"] == field, answer
    assert registry.store.revision == 0


async def test_thresholds_survive_a_registry_restart(start_registry, http, tmp_path):
    first = await start_registry(tmp_path / "alerts")
    async with http.put(f"{first.url}/settings/alerts", json=STRICT) as response:
        assert response.status == 200
    await first.stop()
    second = await start_registry(tmp_path / "alerts")
    async with http.get(f"{second.url}/settings/alerts") as response:
        assert await response.json() == STRICT

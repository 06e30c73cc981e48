"""/metrics speaks the Prometheus text format and reflects the registry's state."""

from prometheus_client.parser import text_string_to_metric_families

from conftest import post, registration


async def test_metrics_parse_and_count(registry, http):
    await post(http, f"{registry.url}/register", registration("a1", "m.one"))
    await post(http, f"{registry.url}/register", registration("a2", "m.two"))
    await post(http, f"{registry.url}/heartbeat", {"agent_id": "a1", "load": 0.5})
    async with http.get(f"{registry.url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("agentreach_registry_instances", (("state", "healthy"),))] == 1
    assert samples[("agentreach_registry_instances", (("state", "pending"),))] == 1
    assert samples[("agentreach_registry_registrations_total", ())] == 2
    assert samples[("agentreach_registry_heartbeats_total", ())] == 1
    assert samples[("agentreach_registry_capabilities", ())] == 2
    assert samples[("agentreach_registry_eviction_guard_active", ())] == 0
    assert samples[("agentreach_wal_records_total", ())] == 2
    assert samples[("agentreach_wal_revision", ())] == 2

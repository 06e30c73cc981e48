"""Capabilities' declared JSON Schemas: the registry refuses one that is no schema (400 naming the field), the
router refuses a payload that fails an input_schema (400 naming its path) before any instance is called, and
A2A cards carry the schemas."""

from __future__ import annotations

import pytest

from a2a_support import card_at
from conftest import post, registration
from mesh.schemas import MAX_SCHEMA_BYTES

ITEMS = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
         "required": ["items"]}
TOTAL = {"type": "object", "properties": {"total": {"type": "integer"}}}


def declaring(**schemas):
    body = registration("schema-1", "sum")
    body["capabilities"][0].update(schemas)
    return body


@pytest.mark.parametrize(("field", "schema", "said"), [
    ("input_schema", {"type": "nope"}, "is not a valid JSON Schema"),
    ("output_schema", {"properties": {"a": {"minimum": "x"}}}, "is not a valid JSON Schema"),
    ("input_schema", {"$ref": "http://127.0.0.1:9/schema.json"}, "remote $ref is never fetched"),
    ("input_schema", {"$ref": "#/$defs/missing"}, "not in the schema"),
    ("input_schema", {"description": "x" * MAX_SCHEMA_BYTES}, f"at most {MAX_SCHEMA_BYTES}"),
])
async def test_the_registry_refuses_a_schema_that_is_not_one(registry, http, field, schema, said):
    status, answer = await post(http, f"{registry.url}/register", declaring(**{field: schema}))
    assert (status, answer["error"], answer["field"]) == (400, "invalid_schema", f"capabilities[0].{field}")
    assert said in answer["message"]
    status, _ = await post(http, f"{registry.url}/register", declaring(input_schema=["not", "an", "object"]))
    assert status == 400


async def test_declared_schemas_are_kept_with_the_capability(registry, http):
    status, _ = await post(http, f"{registry.url}/register", declaring(input_schema=ITEMS, output_schema=TOTAL))
    assert status == 200
    async with http.get(f"{registry.url}/agents/schema-1") as response:
        [stored] = (await response.json())["capabilities"]
    assert (stored["input_schema"], stored["output_schema"]) == (ITEMS, TOTAL)


async def summing_agent(mesh, make_agent, calls: list[object]) -> None:
    agent = make_agent("sum-1", mesh.registry.url)

    @agent.capability("math.sum", input_schema=ITEMS, output_schema=TOTAL, description="Adds integers")
    async def add(payload, ctx):
        calls.append(payload)
        return {"total": sum(payload["items"])}

    @agent.capability("math.any")
    async def anything(payload, ctx):
        return payload

    await agent.start()
    await mesh.until_state("sum-1")


async def test_a_payload_failing_the_input_schema_is_refused_with_its_path(mesh, make_agent):
    calls: list[object] = []
    await summing_agent(mesh, make_agent, calls)
    good = await mesh.call("math.sum", {"items": [1, 2, 3]})
    assert (good.status, good.body["result"]) == (200, {"total": 6})
    bad = await mesh.call("math.sum", {"items": [1, "two"]})
    assert (bad.status, bad.body["error_code"], bad.body["field"]) == (400, "INVALID_PAYLOAD", "payload.items[1]")
    assert "'two' is not of type 'integer'" in bad.body["error_message"]
    missing = await mesh.call("math.sum", {})
    assert (missing.status, missing.body["field"]) == (400, "payload")
    assert calls == [{"items": [1, 2, 3]}]  # no refused payload reached the agent
    # A capability declaring no schema takes any payload.
    assert (await mesh.call("math.any", {"items": "anything"})).status == 200


async def test_an_input_schema_is_compiled_once_per_capability_version(mesh, make_agent):
    await summing_agent(mesh, make_agent, [])
    await mesh.call("math.sum", {"items": [1]})
    [(key, (_, compiled))] = mesh.router.schemas._compiled.items()
    await mesh.call("math.sum", {"items": ["x"]})
    await mesh.call("math.sum", {"items": [2]})
    assert key == ("math.sum", "1.0") and mesh.router.schemas._compiled[key][1] is compiled


async def test_a2a_cards_carry_the_schemas(mesh, make_agent):
    await summing_agent(mesh, make_agent, [])
    card = await card_at(f"{mesh.url}/a2a/math.sum")
    [extension] = card.capabilities.extensions
    assert extension.uri == "urn:agentreach:a2a:schemas:v1"
    skills = dict(extension.params)["skills"]
    assert dict(skills["math.sum"]["input_schema"])["required"] == ["items"]
    assert "output_schema" in skills["math.sum"]
    assert not (await card_at(f"{mesh.url}/a2a/math.any")).capabilities.extensions
    catalog = await card_at(mesh.url)
    [extension] = catalog.capabilities.extensions
    assert set(dict(extension.params)["skills"]) == {"math.sum"}

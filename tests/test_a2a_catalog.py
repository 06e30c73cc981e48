"""The router's catalog card (GET /.well-known/agent-card.json): the mesh's capabilities as skills, each caller
seeing only what it may call, and the catalog's endpoint reaching the capability named in metadata."""

from __future__ import annotations

import httpx
from a2a.types import TaskState

from a2a_support import a2a_client, card_at, events, message, text, values


async def test_each_caller_sees_the_capabilities_it_may_call(secure, start_agent):
    mesh, _ = secure
    await mesh.add(await start_agent("open-1"), "open.echo", trust_level="public", description="For anyone",
                   examples=["say hi"])
    public = await mesh.new_client(["echo", "open.echo"], trust_level="public", name="public")
    internal = await mesh.new_client(["echo"], trust_level="internal", name="internal")
    everything = await mesh.new_client(["echo", "open.*"], trust_level="internal", name="everything")
    seen = {}
    for name, client in (("public", public), ("internal", internal), ("everything", everything)):
        card = await card_at(mesh.url, {"X-API-Key": client["api_key"]})
        seen[name] = [skill.id for skill in card.skills]
    # A public client is granted echo but echo needs internal trust; the internal one is not granted open.echo.
    assert seen == {"public": ["open.echo"], "internal": ["echo"], "everything": ["echo", "open.echo"]}
    card = await card_at(mesh.url, {"X-API-Key": public["api_key"]})
    assert card.supported_interfaces[0].url == f"{mesh.url}/a2a" and card.skills[0].description == "For anyone"
    async with httpx.AsyncClient() as http:
        anonymous = await http.get(f"{mesh.url}/.well-known/agent-card.json")
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == 'Bearer realm="agentreach"'


async def test_the_catalog_endpoint_calls_the_capability_named_in_metadata(mesh, start_agent):
    await mesh.add(await start_agent("cat-1"), "cat.echo", description="Echoes")
    card = await card_at(mesh.url)
    assert [(skill.id, skill.description) for skill in card.skills] == [("cat.echo", "Echoes")]
    async with a2a_client(mesh.url) as client:
        [answer] = await events(client, message(text("meow"), metadata={"capability": "cat.echo"}))
        assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert values(answer.task.artifacts[0].parts) == [{"echo": "meow", "agent": "cat-1"}]
    async with httpx.AsyncClient() as http:
        unnamed = (await http.post(f"{mesh.url}/a2a", json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m", "parts": [{"data": {"a": 1}}]}}})).json()
    assert unnamed["error"]["code"] == -32602 and unnamed["error"]["data"][0]["metadata"]["field"] == "capability"

"""Demo agents for `agentreach up --demo`: a live mesh a new user can call at once.

Three SDK agents in the same process, each with its own ATP endpoint on an ephemeral port:
an echo, a keyword intent detector and an order lookup that calls the intent detector through
the router (so its trace is a tree of two calls).

With auth on, each demo service registers with its own registration token, the order agent calls
through the router as the `demo-orders` client (granted intent.detect only), and a `demo-caller`
client (granted the three demo capabilities) is there for people trying the mesh. Their secrets
are kept in ``DATA_DIR/demo/`` (0600) and reused on the next start, so the same key keeps working.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from agent_reach import AgentReachSDK, BusinessFailure, ReachClient

from auth.records import ClientCreate, TokenCreate
from registry.access import Access
from registry.service import Registry
from wal.private import write_private

_INTENTS = {
    "order.query": ("order", "package", "delivery", "shipped", "订单", "快递"),
    "invoice.create": ("invoice", "bill", "receipt", "发票"),
    "weather.forecast": ("weather", "rain", "sunny", "天气"),
}
_ORDERS = {"A-1001": "shipped", "A-1002": "packing", "A-1003": "delivered"}


def detect_intent(text: str) -> tuple[str, float]:
    """A deliberately small keyword classifier: enough to show routing, not a model."""
    lowered = text.lower()
    scores = {intent: sum(word in lowered for word in words) for intent, words in _INTENTS.items()}
    best = max(scores, key=lambda intent: scores[intent])
    return (best, min(1.0, 0.5 + 0.25 * scores[best])) if scores[best] else ("unknown", 0.0)


DEMO_SERVICES = ("demo-echo", "demo-intent", "demo-orders")
DEMO_CAPABILITIES = ["demo.echo", "intent.detect", "order.query"]
ORDERS_CLIENT, ORDERS_GRANTS = "demo-orders", ["intent.detect"]
CALLER_CLIENT = "demo-caller"


class DemoCredentials(msgspec.Struct, kw_only=True):
    """What the demo agents present with auth on: a registration token per service, and the
    order agent's API key for its calls through the router."""

    tokens: dict[str, str]
    orders_api_key: str
    caller_key_path: Path

    def banner(self, router_url: str) -> str:
        """Where to find the demo caller's key, and a call that uses it; no secret in it."""
        return (f"agentreach: demo caller API key (client {CALLER_CLIENT!r}, may call "
                f"{', '.join(DEMO_CAPABILITIES)}) is in {self.caller_key_path}; try:\n"
                f"  curl -s -X POST {router_url}/atp -H \"X-API-Key: $(cat {self.caller_key_path})\" "
                f"-H 'Content-Type: application/json' -d '{{\"capability\": \"demo.echo\", \"payload\": \"hi\"}}'")


def _write_secret(path: Path, secret: str) -> None:
    write_private(path, (secret + "\n").encode(), replace=True)


def _read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


async def _service_token(access: Access, service: str, path: Path) -> str:
    """The stored token when it is still valid for ``service``, else a new one."""
    token = _read_secret(path)
    record = access.book.token(token) if token is not None else None
    if token is not None and record is not None and record.service == service:
        return token
    token = (await access.create_token(TokenCreate(service=service))).token
    _write_secret(path, token)
    return token


async def _client_key(access: Access, name: str, grants: list[str], path: Path) -> str:
    """The stored API key when it still belongs to client ``name``; else that client's key rotated
    (a disabled one stays disabled), or a new client (trust internal) when there is none by that name."""
    key = _read_secret(path)
    holder = access.book.client_by_api_key(key) if key is not None else None
    if key is not None and holder is not None and holder.name == name:
        return key
    existing = next((client for client in access.clients() if client.name == name), None)
    if existing is None:
        key = (await access.create_client(ClientCreate(name=name, trust_level="internal", grants=grants))).api_key
    else:
        key = (await access.rotate(existing.client_id)).api_key
    _write_secret(path, key)
    return key


async def demo_credentials(registry: Registry, data_dir: Path) -> DemoCredentials:
    """Mint (or reuse) the demo's credentials in process, through the registry's own Access."""
    access, folder = registry.access, data_dir / "demo"
    tokens = {service: await _service_token(access, service, folder / f"{service}.token")
              for service in DEMO_SERVICES}
    orders_key = await _client_key(access, ORDERS_CLIENT, ORDERS_GRANTS, folder / f"{ORDERS_CLIENT}.key")
    caller_path = folder / f"{CALLER_CLIENT}.key"
    await _client_key(access, CALLER_CLIENT, DEMO_CAPABILITIES, caller_path)
    return DemoCredentials(tokens=tokens, orders_api_key=orders_key, caller_key_path=caller_path)


def _echo_agent(registry_url: str, token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-echo-01", registry_url=registry_url, zone="local", service="demo-echo",
                        registration_token=token)

    @sdk.capability("demo.echo", description="Echo the payload back", examples=["say hello back to me"],
                    timeout_sla_ms=5_000)
    async def echo(payload: Any, ctx: Any) -> dict[str, Any]:
        return {"echo": payload, "request_id": ctx.request_id}

    return sdk


def _intent_agent(registry_url: str, token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-intent-01", registry_url=registry_url, zone="local", service="demo-intent",
                        metadata={"model": "keywords-v1", "max_qps": 200}, registration_token=token)

    @sdk.capability("intent.detect", version="3.2", description="Classify a user utterance into an intent",
                    examples=["classify the intent of this message", "what does the user want here"],
                    timeout_sla_ms=2_000, idempotent=True)
    async def detect(payload: Any, ctx: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise BusinessFailure("missing_text", "intent.detect expects {\"text\": \"...\"}")
        intent, confidence = detect_intent(payload["text"])
        ctx.report_tokens(len(payload["text"].split()))
        return {"intent": intent, "confidence": confidence}

    return sdk


def _order_agent(registry_url: str, router_url: str, token: str | None,
                 api_key: str | None) -> tuple[AgentReachSDK, ReachClient]:
    sdk = AgentReachSDK(agent_id="demo-orders-01", registry_url=registry_url, zone="local", service="demo-orders",
                        metadata={"model": "lookup", "max_qps": 100}, registration_token=token)
    client = ReachClient(router_url, api_key=api_key)

    @sdk.capability("order.query", description="Look up the status of an order by id or from a sentence",
                    examples=["where is order A-1001", "has my package shipped", "track my order",
                              "when will my parcel arrive", "我的订单到哪了"], timeout_sla_ms=5_000)
    async def query(payload: Any, ctx: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise BusinessFailure("bad_payload", "order.query expects a JSON object")
        order_id = payload.get("order_id")
        if order_id is None and isinstance(payload.get("text"), str):
            intent = await client.call("intent.detect", {"text": payload["text"]})
            if intent["intent"] != "order.query":
                raise BusinessFailure("not_an_order_question", f"this reads as {intent['intent']}")
            order_id = next((word for word in payload["text"].split() if word in _ORDERS), None)
        if order_id not in _ORDERS:
            raise BusinessFailure("order_not_found", f"no order {order_id!r}")
        return {"order_id": order_id, "status": _ORDERS[order_id]}

    return sdk, client


class DemoAgents:
    """Start and stop the three demo agents together; ``credentials`` None means auth is off."""

    def __init__(self, registry_url: str, router_url: str, credentials: DemoCredentials | None = None):
        tokens = credentials.tokens if credentials is not None else {}
        orders, self._client = _order_agent(registry_url, router_url, tokens.get("demo-orders"),
                                            credentials.orders_api_key if credentials is not None else None)
        self.agents = [_echo_agent(registry_url, tokens.get("demo-echo")),
                       _intent_agent(registry_url, tokens.get("demo-intent")), orders]

    async def start(self) -> None:
        await asyncio.gather(*(agent.start("127.0.0.1", 0) for agent in self.agents))

    async def stop(self) -> None:
        await asyncio.gather(*(agent.stop() for agent in self.agents))
        await self._client.close()

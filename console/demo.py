"""Demo agents for `agentreach up --demo`: a live mesh a new user can call at once.

Three SDK agents in the same process, each with its own ATP endpoint on an ephemeral port:
an echo, a keyword intent detector and an order lookup that calls the intent detector through
the router (so its trace is a tree of two calls).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_reach import AgentReachSDK, BusinessFailure, ReachClient

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


def _echo_agent(registry_url: str) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-echo-01", registry_url=registry_url, zone="local", service="demo-echo")

    @sdk.capability("demo.echo", description="Echo the payload back", examples=["say hello back to me"],
                    timeout_sla_ms=5_000)
    async def echo(payload: Any, ctx: Any) -> dict[str, Any]:
        return {"echo": payload, "request_id": ctx.request_id}

    return sdk


def _intent_agent(registry_url: str) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-intent-01", registry_url=registry_url, zone="local", service="demo-intent",
                        metadata={"model": "keywords-v1", "max_qps": 200})

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


def _order_agent(registry_url: str, router_url: str) -> tuple[AgentReachSDK, ReachClient]:
    sdk = AgentReachSDK(agent_id="demo-orders-01", registry_url=registry_url, zone="local", service="demo-orders",
                        metadata={"model": "lookup", "max_qps": 100})
    client = ReachClient(router_url)

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
    """Start and stop the three demo agents together."""

    def __init__(self, registry_url: str, router_url: str):
        orders, self._client = _order_agent(registry_url, router_url)
        self.agents = [_echo_agent(registry_url), _intent_agent(registry_url), orders]

    async def start(self) -> None:
        await asyncio.gather(*(agent.start("127.0.0.1", 0) for agent in self.agents))

    async def stop(self) -> None:
        await asyncio.gather(*(agent.stop() for agent in self.agents))
        await self._client.close()

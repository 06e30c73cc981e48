"""The same intent-detection service after joining Agent Reach (the seed article's example, section 4.3).

    agentreach up                              # the mesh: registry :8081, router :8080, auth on
    export AGENTREACH_TOKEN=$(agentreach tokens create --service intent | jq -r .token)
    python examples/intent_fastapi_after.py    # serves POST /internal/intent on :8000 as intent.detect

Compared with intent_fastapi_before.py: the SDK is created and attached, the route is decorated
with register_capability, and moved to /internal/intent so callers go through the mesh.
"""

import os
from urllib.parse import urlsplit

from agent_reach import AgentReachSDK, logs, register_capability
from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()
reach_sdk = AgentReachSDK(
    agent_id="intent-agent-prod-01",
    registry_url=os.environ.get("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"),
    zone="cn-east-1",
    base_url=os.environ.get("INTENT_BASE_URL", "http://127.0.0.1:8000"),
    registration_token=os.environ.get("AGENTREACH_TOKEN"),
)
reach_sdk.attach(app)


class IntentRequest(BaseModel):
    text: str
    session_id: str


class IntentResponse(BaseModel):
    intent: str
    confidence: float


KEYWORDS = {"refund": "refund.request", "invoice": "billing.invoice", "password": "account.reset"}


def do_intent_detection(text: str) -> tuple[str, float]:
    """A stand-in for the model: the first known keyword wins."""
    words = text.lower().split()
    intent = next((KEYWORDS[word] for word in words if word in KEYWORDS), "smalltalk")
    return intent, 0.9 if intent != "smalltalk" else 0.5


@register_capability(reach_sdk, name="intent.detect", protocol="rest", version="3.2")
@app.post("/internal/intent")
async def detect_intent(req: IntentRequest):
    intent, score = do_intent_detection(req.text)
    return IntentResponse(intent=intent, confidence=score)


if __name__ == "__main__":
    import uvicorn

    logs.configure()
    uvicorn.run(app, host="127.0.0.1", port=urlsplit(reach_sdk.base_url).port)

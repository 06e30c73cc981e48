"""An intent-detection service before joining Agent Reach (the seed article's example, section 4.3).

    python examples/intent_fastapi_before.py   # serves POST /intent on :8000
"""

from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()


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


@app.post("/intent")
async def detect_intent(req: IntentRequest):
    intent, score = do_intent_detection(req.text)
    return IntentResponse(intent=intent, confidence=score)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)

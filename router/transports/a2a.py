"""A2A agents (``protocol: "a2a"``, the endpoint their card's URL): JSON-RPC to the interface the card names,
answers and stream events read by router/a2a/outbound.py's pure functions into verdicts, made AgentAnswers
here; a stream given up before its end cancels the agent's task."""

from __future__ import annotations

import aiohttp
import msgspec
from agent_reach.atp import BusinessError, RequestFrame

from router.a2a.outbound import A2AAgents, CardError, Verdict, a2a_request, stream_step, verdict_of
from router.transports.answer import AgentAnswer, failed_status
from router.transports.http import Dialect, Step, Unreachable


def _answer(verdict: Verdict) -> AgentAnswer:
    business = None if verdict.business_code is None else BusinessError(code=verdict.business_code,
                                                                         message=verdict.message)
    return AgentAnswer(error_code=verdict.error_code, message=verdict.message, result=verdict.result,
                       business_error=business)


class A2ADialect(Dialect):
    def __init__(self, agents: A2AAgents):
        self.agents = agents

    def request(self, frame: RequestFrame, timeout_hint_ms: int) -> tuple[bytes, dict[str, str]]:
        return a2a_request(frame, timeout_hint_ms)

    def classify(self, status: int, body: bytes) -> AgentAnswer:
        return _answer(verdict_of(body)) if 200 <= status < 300 else failed_status(status)

    def step(self, name: str, data: bytes, last: msgspec.Raw) -> Step:
        step = stream_step(name, data, last)
        return Step(step.chunks, None if step.final is None else _answer(step.final), step.task_id)

    async def target(self, endpoint: str, timeout: aiohttp.ClientTimeout) -> str:
        """An A2A agent's endpoint is its card, which names where it takes calls."""
        try:
            return await self.agents.rpc_url(endpoint, timeout)
        except CardError as exc:
            raise Unreachable(str(exc)) from exc

    def abandon(self, url: str, task_id: str) -> None:
        self.agents.cancel(url, task_id)

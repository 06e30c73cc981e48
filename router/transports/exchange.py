"""One call's answer read as messages (the WebSocket and mq transports): chunks relayed as they come, then the
reply classified, under the call's first-byte / idle / total deadlines; the answer says which one fired."""

from __future__ import annotations

import asyncio

import msgspec
from agent_reach.atp import ErrorCode
from agent_reach.socket_wire import REPLY, Envelope

from router.streaming import Relay
from router.timeouts import ResolvedTimeouts
from router.transports.answer import AgentAnswer
from router.transports.atp import AtpDialect

# What a call's queue holds: a message for it (its envelope and body), or why its connection was lost (WebSocket).
Received = tuple[Envelope, bytes] | str


class Exchange:
    """One call's messages read under its deadlines: first byte, then idle between chunks, and the total. A
    ``str`` in the queue says the connection to the agent was lost (why), with the call on it."""

    def __init__(self, timeouts: ResolvedTimeouts, max_answer_bytes: int):
        self.timeouts = timeouts
        self.limit = max_answer_bytes
        self.size = 0
        self.chunks = 0
        # Whether the agent is done with the call (it replied, or the connection is gone): else it is told to stop.
        self.ended = False

    async def answer(self, queue: asyncio.Queue[Received], relay: Relay,
                     dialect: AtpDialect) -> AgentAnswer:
        timeouts = self.timeouts
        ends_at = asyncio.get_running_loop().time() + timeouts.total_s
        while True:
            wait_s = timeouts.first_byte_s if self.chunks == 0 else timeouts.idle_s
            waits_for = "first_byte" if self.chunks == 0 else "idle"
            now = asyncio.get_running_loop().time()
            if now + wait_s >= ends_at:
                wait_s, waits_for = ends_at - now, "total"
            try:
                received = await asyncio.wait_for(queue.get(), max(wait_s, 0))
            except TimeoutError:
                return self.timed_out(waits_for)
            if isinstance(received, str):
                self.ended = True
                return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, chunks=self.chunks,
                                   message=f"the agent's connection was lost with the call on it "
                                           f"({received}; after {self.chunks} chunks)")
            envelope, body = received
            self.size += len(body)
            if self.size > self.limit:
                return AgentAnswer(error_code=ErrorCode.ANSWER_TOO_LARGE, chunks=self.chunks,
                                   message=f"agent's answer exceeds the router's limit of {self.limit} bytes")
            if envelope.type == REPLY:
                self.ended = True
                answer = dialect.classify(envelope.status, body)
                answer.chunks = self.chunks
                return answer
            try:
                chunk = dialect.chunk(body)
            except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
                return AgentAnswer(error_code=ErrorCode.AGENT_ERROR, chunks=self.chunks,
                                   message=f"agent answered a malformed answer: a chunk is not JSON ({exc})")
            await relay.pass_on([chunk])
            self.chunks += 1

    def timed_out(self, waits_for: str) -> AgentAnswer:
        timeouts = self.timeouts
        if waits_for == "first_byte":
            return AgentAnswer(error_code=ErrorCode.FIRST_BYTE_TIMEOUT, chunks=self.chunks,
                               message=f"no answer within {timeouts.first_byte_s * 1000:.0f} ms")
        if waits_for == "idle":
            return AgentAnswer(error_code=ErrorCode.IDLE_TIMEOUT, chunks=self.chunks,
                               message=f"no chunk for {timeouts.idle_s * 1000:.0f} ms after {self.chunks} chunks")
        return AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT, chunks=self.chunks,
                           message=f"call not finished within {timeouts.total_s * 1000:.0f} ms")

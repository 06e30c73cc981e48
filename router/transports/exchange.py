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
from router.transports.deadlines import Deadlines

# What a call's queue holds: a message for it (its envelope and body), or why its connection was lost (WebSocket).
Received = tuple[Envelope, bytes] | str


class Exchange:
    """One call's messages read under its deadlines: first byte, then idle between chunks, and the total. A
    ``str`` in the queue says the connection to the agent was lost (why), with the call on it."""

    def __init__(self, timeouts: ResolvedTimeouts, max_answer_bytes: int):
        self.deadlines = Deadlines(timeouts)
        self.limit = max_answer_bytes
        self.size = 0
        self.chunks = 0
        # Whether the agent is done with the call (it replied, or the connection is gone): else it is told to stop.
        self.ended = False

    async def answer(self, queue: asyncio.Queue[Received], relay: Relay,
                     dialect: AtpDialect) -> AgentAnswer:
        while True:
            wait_s, waits_for = self.deadlines.next_wait(self.chunks)
            try:
                received = await asyncio.wait_for(queue.get(), wait_s)
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
        return self.deadlines.timed_out(waits_for, self.chunks)

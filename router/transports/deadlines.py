"""One call's waits for its messages under its timeouts, for the transports that read an answer as messages
(WebSocket, mq, gRPC): the first within first byte, each next within idle of the last, all within total."""

from __future__ import annotations

import asyncio

from agent_reach.atp import ErrorCode

from router.timeouts import ResolvedTimeouts
from router.transports.answer import AgentAnswer


class Deadlines:
    def __init__(self, timeouts: ResolvedTimeouts):
        self.timeouts = timeouts
        self.ends_at = asyncio.get_running_loop().time() + timeouts.total_s

    def next_wait(self, chunks: int) -> tuple[float, str]:
        """How long to wait for the next message (never below 0), and which timeout that wait is."""
        wait_s, waits_for = ((self.timeouts.first_byte_s, "first_byte") if chunks == 0
                             else (self.timeouts.idle_s, "idle"))
        now = asyncio.get_running_loop().time()
        if now + wait_s >= self.ends_at:
            wait_s, waits_for = self.ends_at - now, "total"
        return max(wait_s, 0), waits_for

    def timed_out(self, waits_for: str, chunks: int) -> AgentAnswer:
        timeouts = self.timeouts
        if waits_for == "first_byte":
            return AgentAnswer(error_code=ErrorCode.FIRST_BYTE_TIMEOUT, chunks=chunks,
                               message=f"no answer within {timeouts.first_byte_s * 1000:.0f} ms")
        if waits_for == "idle":
            return AgentAnswer(error_code=ErrorCode.IDLE_TIMEOUT, chunks=chunks,
                               message=f"no chunk for {timeouts.idle_s * 1000:.0f} ms after {chunks} chunks")
        return AgentAnswer(error_code=ErrorCode.TOTAL_TIMEOUT, chunks=chunks,
                           message=f"call not finished within {timeouts.total_s * 1000:.0f} ms")

"""A gRPC server speaking agentreach.v1.Agent the way another team's server might (no SDK: whatever its script
answers), and a direct gRPC call to an agent, around the router."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from agent_reach.grpc_wire import CALL_METHOD, SERVICE, metadata
from agent_reach.proto.agent_pb2 import CallReply, CallRequest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

# One call: the request as it came, and the servicer context to answer (or abort) with.
Script = Callable[[CallRequest, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]


class ScriptedGrpcAgent:
    protocol = "grpc"

    def __init__(self, name: str, script: Script):
        self.name = name
        self.script = script
        self.calls: list[CallRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.health = health.aio.HealthServicer()
        self._server = grpc.aio.server()
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> ScriptedGrpcAgent:
        async def call(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            request = CallRequest.FromString(raw)
            self.calls.append(request)
            self.metadata.append({key: value for key, value in context.invocation_metadata() or ()
                                  if isinstance(value, str)})
            return await self.script(request, context)

        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Call": grpc.unary_unary_rpc_method_handler(call)}),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        return self

    async def stop(self) -> None:
        await self._server.stop(None)


@pytest.fixture
async def grpc_agent() -> AsyncIterator[Callable[[str, Script], Awaitable[ScriptedGrpcAgent]]]:
    """``await grpc_agent(name, script)``: a running ScriptedGrpcAgent, stopped at teardown."""
    started: list[ScriptedGrpcAgent] = []

    async def start(name: str, script: Script) -> ScriptedGrpcAgent:
        agent = await ScriptedGrpcAgent(name, script).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        await agent.stop()


def reply(result: bytes) -> bytes:
    return CallReply(result=result).SerializeToString()


async def call_directly(endpoint: str, request: CallRequest, headers: dict[str, str],
                        body: bytes | None = None) -> tuple[grpc.StatusCode, CallReply | str]:
    """One ``Call`` around the router: the status, and the reply or the status's details."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        try:
            raw = await channel.unary_unary(CALL_METHOD)(body if body is not None else request.SerializeToString(),
                                                         metadata=metadata(headers), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, CallReply.FromString(raw)

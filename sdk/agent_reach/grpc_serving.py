"""An agent's end of ATP over gRPC (agent_reach.grpc_wire): its capabilities with ``protocol="grpc"`` served
by one grpc.aio server, each call through the same Dispatcher as an HTTP call (signature, deadline, in-flight
count, drain, business errors, streaming), beside the standard ``grpc.health.v1.Health`` service that the
registry probes and that follows the agent's own health check.

The request arrives as its bytes, unparsed: the router signed those bytes, so they are verified as they came.
The router going away (a deadline, a cancel, the connection lost) cancels the call's task: the handler sees
CancelledError at its next await.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
import msgspec
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from multidict import CIMultiDict

from agent_reach import logs
from agent_reach.atp import ErrorCode
from agent_reach.dispatch import Dispatcher, Native
from agent_reach.grpc_wire import (
    ENVELOPE_BYTES,
    ERROR_CODE_TRAILER,
    SERVICE,
    Refusal,
    headers,
    reply_message,
    request_body,
)
from agent_reach.proto.agent_pb2 import CallEvent, CallReply, CallRequest, Chunk

log = logging.getLogger("agentreach.sdk")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class StreamChunks:
    """One call's chunks as ``CallEvent`` messages on its gRPC stream."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]):
        self.context = context

    @contextlib.contextmanager
    def watch(self, caller_gone: Callable[[], Any]) -> Iterator[bool]:
        """Nothing to hook: the router leaving cancels the call's own task."""
        yield True

    async def chunk(self, request_id: str, seq: int, data: msgspec.Raw) -> None:
        if self.context.done():
            raise ConnectionResetError("the router's call ended")
        await self.context.write(CallEvent(chunk=Chunk(seq=seq, data=bytes(data))))


class GrpcServer:
    """The agent's gRPC server for its ``grpc`` capabilities: ``start`` binds, ``stop`` ends it."""

    def __init__(self, dispatcher: Dispatcher, natives: Mapping[str, Native]):
        self.dispatcher = dispatcher
        self.natives = natives
        self.health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); the port bound."""
        limit = max(native.capability.max_payload_bytes for native in self.natives.values()) + ENVELOPE_BYTES
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", -1),
                                          ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Call": grpc.unary_unary_rpc_method_handler(self._call, response_serializer=CallReply.SerializeToString),
            "CallStream": grpc.unary_stream_rpc_method_handler(self._stream,
                                                               response_serializer=CallEvent.SerializeToString),
        }),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        bound: int = server.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
        if bound == 0:
            raise OSError(f"gRPC server could not bind {host}:{port}")
        await server.start()
        self._server = server
        await self.set_health(True)
        return bound

    async def set_health(self, healthy: bool) -> None:
        status = SERVING if healthy else NOT_SERVING
        for service in ("", SERVICE):
            await self.health.set(service, status)

    async def stop(self, grace_s: float) -> None:
        """Stop taking calls; those still running get ``grace_s`` (the dispatcher has drained them by then)."""
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        self._server = None

    async def _call(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> CallReply:
        answer = await self._serve(raw, context, stream=False)
        if isinstance(answer, Refusal):
            await _refuse(context, answer)
        assert isinstance(answer, CallReply)
        return answer

    async def _stream(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        answer = await self._serve(raw, context, stream=True)
        if isinstance(answer, Refusal):
            await _refuse(context, answer)
        assert isinstance(answer, CallReply)
        await context.write(CallEvent(reply=answer))

    async def _serve(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any],
                     stream: bool) -> CallReply | Refusal:
        try:
            request = CallRequest.FromString(raw)
        except DecodeError as exc:
            log.warning("grpc_message_refused", extra={"why": f"not a CallRequest: {exc}"})
            return Refusal(grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_FRAME,
                           f"not an agentreach.v1.CallRequest: {exc}")
        native = self.natives.get(request.capability)
        body = request_body(request, context.time_remaining(), stream)
        with logs.bind(request_id=request.request_id, capability=request.capability):
            reply = await self.dispatcher.handle(native, request.capability, body,
                                                 CIMultiDict(headers(context.invocation_metadata() or ())),
                                                 caller_gone=context.done,
                                                 out=StreamChunks(context) if stream else None, signed=raw)
        return reply_message(reply.status, reply.body)


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], refusal: Refusal) -> None:
    context.set_trailing_metadata(((ERROR_CODE_TRAILER, refusal.code.value),))
    await context.abort(refusal.status, refusal.message)

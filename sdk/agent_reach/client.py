"""Calling a capability through the router: one call, a result or a ReachError.

Inside an SDK handler, calls inherit the incoming context (see :mod:`agent_reach.context`) and
the remaining deadline. When the router cannot be reached and ``direct_fallback`` is on, the
call goes straight to an agent found through the registry, and the route says so (degraded).
``stream`` reads a streamed answer chunk by chunk (through a router only: it has no direct fallback).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import aiohttp

from agent_reach.atp import BusinessError, ErrorCode, ErrorFrame, RequestFrame, ResponseFrame, RouteFacts, error_frame
from agent_reach.context import current, outgoing_context, remaining_budget
from agent_reach.credentials import ClientCredentials, TokenRefused
from agent_reach.direct import DirectRoute
from agent_reach.headers import API_KEY_HEADER
from agent_reach.sse import ChunkFrame
from agent_reach.transport import Answer, Failover, Silent, Streamed, Unreachable, exchange, exchange_stream

# Extra seconds to wait past a call's timeout, so the router's own TOTAL_TIMEOUT frame arrives first.
ANSWER_GRACE = 1.0


class ReachError(Exception):
    """A call that did not succeed: an error frame, a business error, or a busy answer."""

    def __init__(self, frame: Answer):
        self.frame = frame
        if isinstance(frame, ErrorFrame):
            self.error_code, self.can_retry, message = frame.error_code, frame.can_retry, frame.error_message
        elif frame.business_error is not None:
            self.error_code, self.can_retry = ErrorCode.BUSINESS_ERROR, False
            message = f"{frame.business_error.code}: {frame.business_error.message}"
        else:
            self.error_code, self.can_retry, message = ErrorCode.BUSY, True, f"status {frame.status}"
        super().__init__(f"{self.error_code}: {message}")

    @property
    def business_error(self) -> BusinessError | None:
        return self.frame.business_error

    @property
    def route(self) -> RouteFacts | None:
        return self.frame.route


def result_of(answer: Answer) -> Any:
    if isinstance(answer, ResponseFrame) and answer.status == "success":
        return answer.result
    raise ReachError(answer)


class ReachClient:
    """One aiohttp session per client; use ``async with`` or call ``close()``.

    ``last_route`` describes the latest call's route; concurrent callers that need each call's
    route should read ``frame.route`` from ``send()`` (or ``ReachError.route``) instead.
    """

    def __init__(self, router_url: str | Sequence[str], api_key: str | None = None, client_id: str | None = None,
                 client_secret: str | None = None, direct_fallback: bool = False, registry_url: str | None = None,
                 registry_token: str | None = None, connect_timeout: float = 1.0):
        """``router_url``: one router, or several (a list or comma-separated) to fail over between when
        nothing could be sent to one (see ``send``). ``registry_token``: a registration token (an agent's
        own), for the direct fallback's registry queries."""
        if direct_fallback and not registry_url:
            raise ValueError("direct_fallback needs registry_url: that is where agents are found without the router")
        if (client_id is None) != (client_secret is None):
            raise ValueError("client_id and client_secret go together")
        self.routers = Failover(router_url)
        self._api_key = api_key
        # One token endpoint per router: the token a router issues is accepted by every router of the mesh.
        self._credentials = ({url: ClientCredentials(f"{url}/oauth/token", client_id, client_secret)
                              for url in self.routers.urls}
                             if client_id is not None and client_secret is not None else {})
        self._direct = DirectRoute(registry_url, registry_token) if direct_fallback and registry_url else None
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self.last_route: RouteFacts | None = None

    @property
    def router_url(self) -> str:
        """The router that answered last (calls go there first)."""
        return self.routers.current

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> ReachClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def call(self, capability: str, payload: Any, context: Mapping[str, Any] | None = None,
                   timeout: float | None = None, version: str | None = None) -> Any:
        """The capability's result; raises ReachError when the call did not succeed. ``version``: a
        constraint on the capability's version (">=3.2", "^3", "~3.2", "3.2.1", ">=3,<4")."""
        answer = await self.send(_frame(capability, payload, context, timeout, version=version))
        self._answered(answer)
        return result_of(answer)

    async def stream(self, capability: str, payload: Any, context: Mapping[str, Any] | None = None,
                     timeout: float | None = None,
                     version: str | None = None) -> AsyncGenerator[ChunkFrame | ResponseFrame, None]:
        """The capability's answer as it is produced: each chunk as it arrives, then the final frame;
        raises ReachError when the call did not succeed (after the chunks that came before). Closing it
        early hangs up, which cancels the call at the agent: leave the loop inside
        ``async with contextlib.aclosing(client.stream(...))`` (else the hang-up waits for the collector)."""
        frame = _frame(capability, payload, context, timeout, stream=True, version=version)
        async for item in self.send_stream(frame):
            if isinstance(item, ChunkFrame):
                yield item
                continue
            self._answered(item)
            result_of(item)
            assert isinstance(item, ResponseFrame)
            yield item

    def _answered(self, answer: Answer) -> None:
        """Note a call's final frame: its route, and the tokens it cost the handler calling (if any)."""
        self.last_route = answer.route
        caller = current()
        if caller is not None and isinstance(answer, ResponseFrame) and answer.context_update:
            caller.spent_by_callee(int(answer.context_update.get("tokens_used", 0)))

    async def send_stream(self, frame: RequestFrame) -> AsyncIterator[Streamed]:
        """``send`` for a streamed call: its chunks, then its final frame, never raising for a failed call.
        Routers are failed over only while none could be connected to, as for ``send``."""
        timeout = _client_timeout(frame, self.connect_timeout)
        unreachable = []
        for router in self.routers.order():
            try:
                headers = await self._auth_headers(router, timeout)
                async for item in exchange_stream(self.session, f"{router}/atp", frame, headers=headers,
                                                  timeout=timeout):
                    yield item
            except TokenRefused as exc:
                yield error_frame(frame.request_id, ErrorCode.UNAUTHENTICATED, str(exc))
            except Unreachable as exc:
                self.routers.failed(router)
                unreachable.append(str(exc))
                continue
            else:
                self.routers.answered(router)
            return
        yield error_frame(frame.request_id, ErrorCode.CONNECT_TIMEOUT, f"Router unreachable: {'; '.join(unreachable)}")

    async def send(self, frame: RequestFrame) -> Answer:
        """The raw answer to ``frame``; never raises for a failed call, only returns its frame.

        Only a router nothing was sent to (no connection, a kept-alive one found closed, no token from
        it) is left for the next one;
        any other failure may have run the call, so it is answered, never sent again. A router that
        let the call time out without a word goes behind the others for the calls that follow."""
        timeout = _client_timeout(frame, self.connect_timeout)
        unreachable = []
        for router in self.routers.order():
            try:
                answer = await exchange(self.session, f"{router}/atp", frame,
                                        headers=await self._auth_headers(router, timeout), timeout=timeout)
            except TokenRefused as exc:
                return error_frame(frame.request_id, ErrorCode.UNAUTHENTICATED, str(exc))
            except Silent as exc:
                self.routers.failed(router)
                return error_frame(frame.request_id, ErrorCode.TOTAL_TIMEOUT, str(exc))
            except Unreachable as exc:
                self.routers.failed(router)
                unreachable.append(str(exc))
                continue
            self.routers.answered(router)
            return answer
        reason = "; ".join(unreachable)
        if self._direct is None:
            return error_frame(frame.request_id, ErrorCode.CONNECT_TIMEOUT, f"Router unreachable: {reason}")
        return await self._direct.send(self.session, frame, timeout, reason=reason)

    async def _auth_headers(self, router: str, timeout: aiohttp.ClientTimeout) -> dict[str, str]:
        headers = {}
        if self._api_key is not None:
            headers[API_KEY_HEADER] = self._api_key
        credentials = self._credentials.get(router)
        if credentials is not None:
            try:
                headers["Authorization"] = await credentials.authorization(self.session, timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # No call was sent, and a token may be asked for again: the next router is safe to try.
                raise Unreachable(f"{credentials.token_url}: {exc!r}") from exc
        return headers


def _frame(capability: str, payload: Any, context: Mapping[str, Any] | None, timeout: float | None,
           stream: bool = False, version: str | None = None) -> RequestFrame:
    """A call's frame: the context and the deadline inherited inside a handler (agent_reach.context)."""
    timeout = remaining_budget(timeout)
    return RequestFrame(capability=capability, payload=payload, context=outgoing_context(context),
                        timeout_hint=None if timeout is None else int(timeout * 1000), stream=stream,
                        version=version)


def _client_timeout(frame: RequestFrame, connect_timeout: float) -> aiohttp.ClientTimeout:
    total = None if frame.timeout_hint is None else frame.timeout_hint / 1000 + ANSWER_GRACE
    return aiohttp.ClientTimeout(total=total, sock_connect=connect_timeout)


class SyncReachClient:
    """ReachClient for scripts without an event loop: the same calls, blocking, on a private loop."""

    def __init__(self, router_url: str | Sequence[str], **options: Any):
        self._loop = asyncio.new_event_loop()
        self._client = ReachClient(router_url, **options)

    @property
    def last_route(self) -> RouteFacts | None:
        return self._client.last_route

    def call(self, capability: str, payload: Any, context: Mapping[str, Any] | None = None,
             timeout: float | None = None, version: str | None = None) -> Any:
        return self._loop.run_until_complete(self._client.call(capability, payload, context, timeout, version))

    def send(self, frame: RequestFrame) -> Answer:
        return self._loop.run_until_complete(self._client.send(frame))

    def stream(self, capability: str, payload: Any, context: Mapping[str, Any] | None = None,
               timeout: float | None = None, version: str | None = None) -> Iterator[ChunkFrame | ResponseFrame]:
        """``ReachClient.stream``, as a plain iterator; leaving it early (or closing it) hangs up."""
        chunks = self._client.stream(capability, payload, context, timeout, version)
        try:
            while True:
                try:
                    item = self._loop.run_until_complete(anext(chunks))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self._loop.run_until_complete(chunks.aclose())

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()

    def __enter__(self) -> SyncReachClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

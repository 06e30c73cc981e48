"""The official MCP SDK's client (Streamable HTTP) against the real router: one connected with given headers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


@contextlib.asynccontextmanager
async def mcp_client(url: str, headers: dict[str, str] | None = None,
                     message_handler: Any = None) -> AsyncIterator[Client]:
    """An MCP client connected (initialized) to the server at ``url``, sending ``headers`` on every request;
    ``message_handler`` sees what the server sends unasked (notifications)."""
    async with httpx2.AsyncClient(headers=headers or {}, timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http), message_handler=message_handler) as client:
        yield client

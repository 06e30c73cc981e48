"""JSON answers: a body encoded by msgspec, and errors in the one envelope."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from weblayer.errors import ApiError

_encoder = msgspec.json.Encoder()
# A browser never guesses another type for an answer (an agent's text served back as a page).
NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json",
                        headers={**NOSNIFF, **headers} if headers else NOSNIFF)


def error_response(error: ApiError) -> web.Response:
    return json_response(error.body(), error.status, error.headers)

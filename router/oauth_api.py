"""The router's OAuth2 endpoints (with authentication on): the client-credentials token endpoint, its JWKS
and key rotation, and the admin-key check behind every admin-only endpoint."""

from __future__ import annotations

import logging
from typing import Any, cast

from aiohttp import web
from multidict import MultiMapping

from router.app_keys import AUTH_KEY, ROUTER_KEY
from router.oauth import OAuthRefusal
from weblayer.errors import ApiError
from weblayer.responses import json_response

log = logging.getLogger("agentreach.router.api")


async def token(request: web.Request) -> web.Response:
    """POST /oauth/token (RFC 6749 §4.4): client credentials in, a signed access token out."""
    if request.content_type != "application/x-www-form-urlencoded":
        answer: Any = OAuthRefusal(error="invalid_request", field="Content-Type",
                                   error_description="Send the token request as application/x-www-form-urlencoded")
    else:
        # A urlencoded form holds text only (files come in multipart bodies, refused above).
        form = cast("MultiMapping[str]", await request.post())
        answer = request.app[AUTH_KEY].issuer.grant(form, request.headers.get("Authorization"),
                                                    request.app[ROUTER_KEY].mirror.auth)
    headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
    if isinstance(answer, OAuthRefusal):
        if answer.basic:
            headers["WWW-Authenticate"] = 'Basic realm="agentreach"'
        log.warning("token refused", extra={"error": answer.error, "reason": answer.error_description})
        return json_response(answer.body(), answer.status, headers)
    return json_response(answer, 200, headers)


async def jwks(request: web.Request) -> web.Response:
    return json_response(request.app[AUTH_KEY].issuer.jwks())


async def rotate_keys(request: web.Request) -> web.Response:
    issuer = request.app[AUTH_KEY].issuer
    key = issuer.keys.rotate()
    return json_response({"kid": key.kid, "jwks": issuer.jwks()})


async def admin_refusal(request: web.Request) -> ApiError | None:
    """The router's check for the admin-only guard: the admin key, as X-API-Key or Authorization: Bearer."""
    refusal = request.app[AUTH_KEY].admin_refusal(request.headers)
    return None if refusal is None else ApiError(refusal.status, refusal.error, refusal.message, "Authorization")



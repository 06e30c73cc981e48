"""What an exception escaping a handler is answered: always JSON in the error envelope, never a traceback.

Refusals (401, 403) are logged: they are the server's side of the security record. A bug is logged with
its traceback and answered as a plain 500 that says nothing of it. A caller that left mid-request is neither:
nothing is answered, and the request handler below counts it (agent_reach.connections).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent_reach.connections import hung_up, unreadable_body
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from weblayer.errors import ApiError
from weblayer.responses import error_response, json_response

# A part's own failures that have a meaning (the registry's storage outage), as the error to answer.
Translate = Callable[[Exception], ApiError | None]


def _untranslated(exc: Exception) -> ApiError | None:
    return None


def http_error(exc: web.HTTPException) -> ApiError:
    """aiohttp's own answers (no route, wrong method, body too large) in the envelope."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return ApiError(413, "payload_too_large", exc.text or "Request body too large")
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
    return ApiError(exc.status, code, exc.reason)


def failure_response(exc: Exception, request: web.Request, who: str, log: logging.Logger) -> web.Response:
    """A body that could not be read (too slow, undecodable) is the caller's; anything else is ours. A caller
    that left is answered nothing: ``exc`` goes on up to the request handler, which counts it."""
    if hung_up(request, exc):
        raise exc
    if isinstance(exc, web.RequestPayloadError):
        status, body = unreadable_body(exc)
        return json_response(body, status)
    log.exception("unhandled error", extra={"path": request.path})
    return error_response(ApiError(500, "internal_error", f"The {who} failed to handle this request"))


def log_refusal(error: ApiError, request: web.Request, log: logging.Logger) -> None:
    if error.status in (401, 403):
        log.warning("request refused", extra={"path": request.path, "method": request.method, "error": error.code,
                                              "reason": error.message, "remote": request.remote})


def errors_as_json(who: str, log: logging.Logger, translate: Translate = _untranslated) -> Middleware:
    """The error middleware of an app named ``who`` ("the registry failed to handle this request")."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            log_refusal(error, request, log)
            return error_response(error)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(http_error(exc))
        except Exception as exc:
            known = translate(exc)
            return error_response(known) if known is not None else failure_response(exc, request, who, log)
    return middleware

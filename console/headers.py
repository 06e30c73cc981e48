"""The security headers on every answer the console gives: pages, static files, the JSON API, the
event stream, refusals and errors alike (one ``on_response_prepare`` hook, no handler sets them).

The Content-Security-Policy lets the page run only the console's own files: no inline script or
event handler, no eval, no inline style (the pages set sizes through the CSSOM, lib/dom.js), nothing
fetched or framed from elsewhere, and the console itself never framed (clickjacking its forms).
"""

from __future__ import annotations

from aiohttp import web

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
}


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)

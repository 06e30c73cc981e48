"""What the router's handlers read from the app (typed AppKeys), apart from the handlers so that the hot path
(router/api.py) and the inspection and OAuth endpoints share them without importing each other."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from router.audit import AuditLog
from router.auth import Authenticator
from router.core import Router

ROUTER_KEY = web.AppKey("router", Router)
METRICS_KEY = web.AppKey("metrics", CollectorRegistry)
# Set only with authentication on / an audit trail kept.
AUTH_KEY = web.AppKey("auth", Authenticator)
AUDIT_KEY = web.AppKey("audit", AuditLog)

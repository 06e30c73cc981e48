"""The OTLP exporter process's POST to the collector, configured as the SDK's OTLP/HTTP exporter is.

The router's exporter writes its own protobuf (router/otlp_wire.py), so it sends the bytes itself rather than
through the SDK's span exporter; the variables and their meaning are the SDK's: the endpoint
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as given, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``),
``_HEADERS``, ``_TIMEOUT`` (seconds, 10 by default), ``_COMPRESSION`` (gzip, deflate or none),
``_CERTIFICATE`` and the client's ``_CLIENT_CERTIFICATE`` / ``_CLIENT_KEY``, each ``_TRACES_`` variable before
its general one. As the SDK does, an answer of 429, 502, 503 or 504 (or a lost connection) is tried again with
exponential back-off within the timeout; any other failure drops the batch: export is best effort.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import random
import ssl
import time
import zlib
from collections.abc import Mapping

import msgspec
from opentelemetry.util.re import parse_env_headers
from yarl import URL

from weblayer.otel import traces_url

log = logging.getLogger("agentreach.router.otel")

RETRYABLE = frozenset({429, 502, 503, 504})
MAX_TRIES = 6
DEFAULT_TIMEOUT = 10.0
DEFAULT_ENDPOINT = "http://localhost:4318"
COMPRESSIONS = ("none", "gzip", "deflate")


class CollectorConfig(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    headers: dict[str, str]
    timeout: float
    compression: str
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None


def _variable(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def shown(url: URL) -> str:
    """What logs name: no user, password or query, which can carry the collector's credentials."""
    return str(url.with_user(None).with_query(None) if url.absolute else url.with_query(None))


class UnusableEndpoint(ValueError):
    """The collector's URL is not an http(s) URL with a host: nothing could ever be sent to it."""


def collector_config(endpoint: str | None, environ: Mapping[str, str]) -> CollectorConfig:
    """Where and how to send: ``endpoint`` is the router's ``--otlp-endpoint`` (a base URL), else the variables.
    Raises UnusableEndpoint for a URL that is not http(s) with a host (``collector:4318`` lacks its scheme)."""
    url = traces_url(endpoint) if endpoint else environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        traces_url(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT)
    try:
        parsed = URL(url)
    except ValueError as exc:
        raise UnusableEndpoint(f"the OTLP endpoint {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UnusableEndpoint(f"the OTLP endpoint {shown(parsed)!r} is not an http:// or https:// URL with a host")
    try:
        timeout = float(_variable(environ, "TIMEOUT") or DEFAULT_TIMEOUT)
    except ValueError:
        log.warning("OTEL_EXPORTER_OTLP_TIMEOUT is not a number of seconds; using the default",
                    extra={"default": DEFAULT_TIMEOUT})
        timeout = DEFAULT_TIMEOUT
    compression = (_variable(environ, "COMPRESSION") or "none").strip().lower()
    if compression not in COMPRESSIONS:
        log.warning("unknown OTEL_EXPORTER_OTLP_COMPRESSION; sending uncompressed", extra={"compression": compression})
        compression = "none"
    return CollectorConfig(url=url, headers=_sendable(parse_env_headers(_variable(environ, "HEADERS") or "",
                                                                       liberal=True)),
                           timeout=timeout, compression=compression, certificate=_variable(environ, "CERTIFICATE"),
                           client_certificate=_variable(environ, "CLIENT_CERTIFICATE"),
                           client_key=_variable(environ, "CLIENT_KEY"))


def _sendable(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers http.client can send: one whose value decodes to a line break or NUL (``%0A`` in the variable)
    is left out with a warning, not sent and not allowed to fail every batch."""
    kept = {}
    for name, value in headers.items():
        if any(character in value or character in name for character in "\r\n\x00") or not name.strip():
            log.warning("an OTEL_EXPORTER_OTLP_HEADERS header is not sendable and is left out", extra={"header": name})
        else:
            kept[name] = value
    return kept


def compressed(body: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(body, compresslevel=6)
    if compression == "deflate":
        return zlib.compress(body)
    return body


class CollectorClient:
    """One kept-alive connection to the collector, opened again when it is lost."""

    def __init__(self, config: CollectorConfig):
        self.config = config
        url = URL(config.url)
        self._https = url.scheme == "https"
        self._host, self._port = url.host or "localhost", url.port
        self._path = url.raw_path_qs or "/"
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": "agentreach-otlp-exporter",
                         **({"Content-Encoding": config.compression} if config.compression != "none" else {}),
                         **config.headers}
        self._connection: http.client.HTTPConnection | None = None
        self.failing = False
        self._shown = shown(url)

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        context = ssl.create_default_context(cafile=self.config.certificate)
        if self.config.client_certificate:
            context.load_cert_chain(self.config.client_certificate, self.config.client_key)
        return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=context)

    def _post(self, body: bytes, timeout: float) -> int | None:
        """The collector's status, or None when the connection failed (and is dropped)."""
        try:
            if self._connection is None:
                self._connection = self._connect(timeout)
            elif self._connection.sock is not None:  # kept alive: its socket still has the first try's timeout
                self._connection.sock.settimeout(timeout)
            self._connection.request("POST", self._path, body, self._headers)
            response = self._connection.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            self.close()
            return None

    def send(self, request: bytes) -> bool:
        """Whether the collector took ``request`` (an encoded ExportTraceServiceRequest)."""
        body = compressed(request, self.config.compression)
        deadline = time.monotonic() + self.config.timeout
        status: int | None = None
        for attempt in range(MAX_TRIES):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            status = self._post(body, remaining)
            if status is not None and 200 <= status < 300:
                self._note(ok=True, status=status)
                return True
            if status is not None and status not in RETRYABLE:
                break
            # A kept-alive connection the collector closed is tried again at once; then 1 s, 2 s, 4 s ... jittered.
            pause = 0.0 if status is None and attempt == 0 else random.uniform(0.8, 1.2) * 2 ** attempt
            if time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
        self._note(ok=False, status=status)
        return False

    def _note(self, ok: bool, status: int | None) -> None:
        """Log when export starts failing and when it recovers, not every batch in between."""
        if ok == (not self.failing):
            return
        self.failing = not ok
        if ok:
            log.info("OTLP export recovered", extra={"collector": self._shown})
        else:
            log.warning("OTLP export failing; batches are dropped until the collector answers",
                        extra={"collector": self._shown, "status": status})

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

"""The flags each part of the mesh takes on the command line, and the settings they stand for.

Reading flags into settings is kept apart from starting servers, so each check reads on its own:
a value the parts cannot run with is a usage error (exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import get_args

from agent_reach.admission import MIN_PER_PEER, Limits
from agent_reach.mq_wire import SCHEMES
from agent_reach.registration import RoutingPolicy
from yarl import URL

from agentreach.credentials import AUTH_ENV, admin_key, default_auth
from console.server import ConsoleSettings
from mesh.egress import NETWORKS_ENV, parse_networks
from registry.access import admin_key_path
from registry.lifecycle import LifecycleConfig
from registry.server import RegistrySettings
from router.audit import MAX_BUFFER
from router.budgets import UNBOUNDED_CALLS
from router.core import RouterSettings
from router.server import RouterServerSettings
from router.transports.base import DEFAULT_MAX_ANSWER_BYTES
from semantic.settings import SemanticSettings

STORE_ENV = "AGENTREACH_STORE"
WORKERS_ENV = "AGENTREACH_WORKERS"
EMBED_MODEL_ENV = "AGENTREACH_EMBED_MODEL"
MAX_WORKERS = 64
# More than this many undeclared calls at once per client would make the bound they give no bound.
MAX_UNBOUNDED_CALLS = 1000
ETCD_ENDPOINTS_ENV = "AGENTREACH_ETCD_ENDPOINTS"
ADVERTISE_URL_ENV = "AGENTREACH_ADVERTISE_URL"


class NoAdminKey(Exception):
    """A part that must present the admin key has none: a usage error, exit 2."""


def add_auth_switch(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--auth", choices=["on", "off"], default=default_auth(),
                        help=f"{what}; off is for development only and is warned about at start-up "
                             f"(default: on, or off when {AUTH_ENV}=off)")


def add_admin_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-key", default=None, metavar="KEY",
                        help="the registry's admin key (default: $AGENTREACH_ADMIN_KEY, else read DATA_DIR/admin.key)")


def required_admin_key(args: argparse.Namespace) -> str | None:
    """The admin key a router or console presents to the registry: required with auth on, used
    when found with auth off too (the registry may still have auth on)."""
    key = admin_key(getattr(args, "admin_key", None), args.data_dir)
    if key is None and args.auth == "on":
        raise NoAdminKey(f"`{args.command}` with auth on needs the registry's admin key: pass --admin-key, set "
                         "AGENTREACH_ADMIN_KEY, or --data-dir where admin.key lives "
                         f"(looked for {admin_key_path(args.data_dir)})")
    return key


def _agent_networks(text: str) -> tuple[str, ...]:
    try:
        return parse_networks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_agent_networks(parser: argparse.ArgumentParser) -> None:
    """The egress rule (mesh/egress.py): the registry checks registrations against it, the router its connections."""
    parser.add_argument("--agent-networks", type=_agent_networks, default=os.environ.get(NETWORKS_ENV, ""),
                        metavar="CIDR[,CIDR...]",
                        help="the only networks agents' URLs may point into, checked at registration and at "
                             "every connection (default: any address but link-local ones, 169.254.0.0/16 and "
                             "fe80::/10, and cloud metadata addresses, which only a network listed inside them "
                             f"opens; or ${NETWORKS_ENV})")


def _connections_per_peer(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 (no limit) or more, not {text!r}")
    return int(text)


def add_connection_knobs(parser: argparse.ArgumentParser) -> None:
    """How a server holds its connections (agent_reach.admission): every part that listens takes it."""
    parser.add_argument("--max-connections-per-peer", type=_connections_per_peer, default=None, metavar="N",
                        help="connections one client address may hold open at once; past it a new one from that "
                             "address is answered 503 too_many_connections and closed; 0: no limit, for a server "
                             "behind a proxy or NAT, where callers share an address (default: a quarter of the "
                             f"connection cap, at least {MIN_PER_PEER})")


def connection_limits(args: argparse.Namespace) -> Limits:
    per_peer = args.max_connections_per_peer
    return Limits() if per_peer is None else Limits(max_connections_per_peer=per_peer)


def add_otlp_endpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-endpoint", type=http_url, default=None, metavar="URL",
                        help="export traces over OTLP/HTTP to the collector at URL (URL/v1/traces); the standard "
                             "OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_* variables are honoured too (default: none, "
                             "nothing exported)")


def http_url(text: str) -> str:
    """An http:// or https:// URL naming a host."""
    try:
        url = URL(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(f"expected http://host:port, got {text!r}")
    return text


def add_registry_knobs(parser: argparse.ArgumentParser) -> None:
    add_otlp_endpoint(parser)
    parser.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                        help="where the WAL and snapshots live (default: ./.agentreach)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--silence-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="demote an instance silent this long (default: 10)")
    parser.add_argument("--health-interval", type=float, default=3.0, metavar="SECONDS",
                        help="seconds between active health checks of demoted instances (default: 3)")
    parser.add_argument("--evict-after", type=int, default=3, metavar="N",
                        help="evict after N consecutive failed health checks (default: 3)")
    parser.add_argument("--evicted-history", type=int, default=1000, metavar="N",
                        help="evicted instances kept in /agents as history, the newest N (default: 1000)")
    parser.add_argument("--evicted-history-hours", type=float, default=24.0, metavar="HOURS",
                        help="evicted instances kept in /agents for at most this long (default: 24)")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    parser.add_argument("--no-group-commit", dest="group_commit", action="store_false",
                        help="fsync every WAL record on its own (slower; for benchmarks)")
    parser.add_argument("--store", choices=["wal", "etcd"], default=os.environ.get(STORE_ENV, "wal"),
                        help="where records live: wal (this registry's local log) or etcd (shared by every "
                             f"registry on one etcd cluster) (default: wal, or ${STORE_ENV})")
    parser.add_argument("--etcd-endpoints", default=os.environ.get(ETCD_ENDPOINTS_ENV, ""), metavar="URL[,URL...]",
                        help=f"etcd client URLs, tried in turn when one fails (default: ${ETCD_ENDPOINTS_ENV})")
    parser.add_argument("--etcd-prefix", default="/agentreach/", metavar="PREFIX",
                        help="the key prefix every record lives under (default: /agentreach/)")
    parser.add_argument("--advertise-url", default=os.environ.get(ADVERTISE_URL_ENV), metavar="URL",
                        help="etcd mode: the URL other registry nodes reach this one at (default: http://HOST:PORT, "
                             f"or ${ADVERTISE_URL_ENV}); needed when listening on 0.0.0.0")
    parser.add_argument("--node-ttl", type=int, default=5, metavar="SECONDS",
                        help="etcd mode: this node's lease; a dead node leaves the cluster, and a dead leader is "
                             "replaced, within it (default: 5)")
    parser.add_argument("--example-evaluation", type=Path, default=None, metavar="INTENTS_JSON",
                        help="labelled intents (tests/semantic_eval/intents.json's layout) no learned example may "
                             "send to a wrong capability: checked at acceptance, with the embed extra")
    add_agent_networks(parser)
    add_connection_knobs(parser)  # `router` and `console` add it on their own: one flag for every server of `up`
    add_embed_model(parser)  # `router` adds it on its own: `up`'s router and registry judge use the same model


def _etcd_endpoints(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """Checked here, so a typo is a usage error rather than a registry that never starts."""
    if args.store not in ("wal", "etcd"):
        parser.error(f"--store must be wal or etcd, not {args.store!r} (from ${STORE_ENV}?)")
    endpoints = [url.strip() for url in args.etcd_endpoints.split(",") if url.strip()]
    if args.store == "etcd" and not endpoints:
        parser.error(f"--store etcd needs --etcd-endpoints URL[,URL...] (or ${ETCD_ENDPOINTS_ENV})")
    for url in endpoints:
        if not url.startswith(("http://", "https://")):
            parser.error(f"--etcd-endpoints: {url!r} is not an http:// or https:// URL")
    if not args.etcd_prefix:
        parser.error("--etcd-prefix must not be empty: the registry would own every key in the cluster")
    if args.store == "etcd" and args.host in ("0.0.0.0", "::") and not args.advertise_url:
        parser.error(f"--store etcd on {args.host} needs --advertise-url (or ${ADVERTISE_URL_ENV}): the URL the "
                     "other registry nodes reach this one at")
    if args.advertise_url and not args.advertise_url.startswith(("http://", "https://")):
        parser.error(f"--advertise-url: {args.advertise_url!r} is not an http:// or https:// URL")
    if not 2 <= args.node_ttl <= 600:
        parser.error("--node-ttl must be from 2 to 600 seconds")
    return endpoints


def _positive(value: float, flag: str, parser: argparse.ArgumentParser) -> None:
    """nan compares false with everything, so it would pass a plain ``<= 0`` and stop every timer."""
    if not math.isfinite(value) or value <= 0:
        parser.error(f"{flag} must be a finite number greater than 0")


def _at_least_zero(value: float, flag: str, parser: argparse.ArgumentParser) -> None:
    """0 is a bound too (no history kept); a negative one means nothing, and nan would keep records for ever."""
    if not math.isfinite(value) or value < 0:
        parser.error(f"{flag} must be a number of at least 0")


def registry_settings(args: argparse.Namespace, port: int, parser: argparse.ArgumentParser) -> RegistrySettings:
    _positive(args.silence_timeout, "--silence-timeout", parser)
    _positive(args.health_interval, "--health-interval", parser)
    _positive(args.evict_after, "--evict-after", parser)
    _at_least_zero(args.evicted_history, "--evicted-history", parser)
    _at_least_zero(args.evicted_history_hours, "--evicted-history-hours", parser)
    if args.example_evaluation is not None and not args.example_evaluation.is_file():
        parser.error(f"--example-evaluation: no file {str(args.example_evaluation)!r}")
    lifecycle = LifecycleConfig(silence_timeout=args.silence_timeout, health_interval=args.health_interval,
                                evict_after=args.evict_after, kept_evicted=args.evicted_history,
                                evicted_max_age=args.evicted_history_hours * 3600)
    return RegistrySettings(data_dir=args.data_dir, host=args.host, port=port, lifecycle=lifecycle,
                            group_commit=args.group_commit, auth=args.auth == "on", store=args.store,
                            etcd_endpoints=_etcd_endpoints(args, parser), etcd_prefix=args.etcd_prefix,
                            advertise_url=args.advertise_url and args.advertise_url.rstrip("/"),
                            node_ttl=args.node_ttl, example_evaluation=args.example_evaluation,
                            embed_model=args.embed_model or None, embed_prompt=args.embed_prompt,
                            agent_networks=args.agent_networks, connections=connection_limits(args),
                            otlp_endpoint=args.otlp_endpoint)


def add_router_knobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--default-policy", choices=get_args(RoutingPolicy), default="least_load",
                        help="routing policy for capabilities without one (default: least_load)")
    parser.add_argument("--semantic", action="store_true",
                        help="route frames that carry an `intent` instead of a capability name, by meaning "
                             "(needs the embed extra: pip install 'agent-reach[embed]')")
    parser.add_argument("--semantic-model", default=None, metavar="NAME",
                        help="embedding model (default: multilingual Universal Sentence Encoder)")
    parser.add_argument("--semantic-threshold", type=float, default=None, metavar="SCORE",
                        help="lowest similarity that may route (default: the model's calibrated value)")
    parser.add_argument("--semantic-margin", type=float, default=None, metavar="SCORE",
                        help="how far the best match must beat the runner-up (default: calibrated)")
    parser.add_argument("--semantic-max-capabilities", type=int, default=64, metavar="N",
                        help="past this many described capabilities, intents are refused: name the "
                             "capability (default: 64)")
    parser.add_argument("--audit-retention-days", type=float, default=30.0, metavar="DAYS",
                        help="keep the audit trail (DATA_DIR/audit.db, one row per call) this long (default: 30)")
    parser.add_argument("--audit-batch-rows", type=int, default=500, metavar="N",
                        help="audit rows handed to the writer process at a time (and at least every 0.5 s): a "
                             "router killed outright loses fewer than N rows (default: 500)")
    parser.add_argument("--no-audit", dest="audit", action="store_false",
                        help="keep no audit trail (when something else records every call)")
    parser.add_argument("--traced-successes-per-second", type=int, default=1000, metavar="N",
                        help="trace at most N plain successes a second (every failed, degraded or refused call "
                             "is traced; the audit trail keeps every call); 0 traces every call (default: 1000)")
    parser.add_argument("--max-answer-bytes", type=int, default=DEFAULT_MAX_ANSWER_BYTES, metavar="BYTES",
                        help="an agent's answer past this many bytes is cut off while read and answered "
                             f"ANSWER_TOO_LARGE (default: {DEFAULT_MAX_ANSWER_BYTES}, 16 MiB)")
    parser.add_argument("--budget-unbounded-calls", type=int, default=UNBOUNDED_CALLS, metavar="N",
                        help="a budgeted client's calls that declare no context.max_tokens / max_cost run N at a "
                             "time per router (the others wait their turn): its budget is passed by at most N "
                             f"calls per router (default: {UNBOUNDED_CALLS})")
    parser.add_argument("--broker", type=broker_url, default=None, metavar="redis://HOST:PORT",
                        help="the message broker mq agents take their calls from (Redis Streams); without it, "
                             "capabilities with protocol mq are not reached (default: none)")
    parser.add_argument("--workers", type=int, default=os.environ.get(WORKERS_ENV, "1"), metavar="N",
                        help="N router processes sharing the port (SO_REUSEPORT), restarted when one dies; each "
                             f"is a router of its own (default: 1, or ${WORKERS_ENV})")


def add_embed_model(parser: argparse.ArgumentParser) -> None:
    """--embed-model and --embed-prompt: a router's second model, and the one its registry judges examples with."""
    parser.add_argument("--embed-model", default=os.environ.get(EMBED_MODEL_ENV), metavar="DIR",
                        help="an operator's sentence-embedding model, a local directory (sentence-transformers or "
                             "Hugging Face BERT folder with model.safetensors and tokenizer.json): asked about the "
                             "intents the shipped model refuses as matching nothing, with the threshold and margin "
                             "`agentreach intents calibrate` stored for it, and by the registry's judge of learned "
                             "examples; on a router it turns --semantic on; needs the embed-model extra (default: "
                             f"${EMBED_MODEL_ENV}, else none)")
    parser.add_argument("--embed-prompt", default="", metavar="TEXT",
                        help="put before every text the --embed-model model embeds (a query prefix its model card "
                             "names, such as 'query: '; default: none)")


def broker_url(text: str) -> str:
    """``--broker``: a redis:// URL naming a host (credentials allowed: they stay in this process)."""
    try:
        url = URL(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {exc}") from None
    if url.scheme not in SCHEMES or not url.host or url.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"expected redis://host:port, got {text!r}")
    return text


def check_router_knobs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse router knobs no router can run with (a usage error, exit 2)."""
    _positive(args.audit_retention_days, "--audit-retention-days", parser)
    if not 1 <= args.audit_batch_rows <= MAX_BUFFER:
        parser.error(f"--audit-batch-rows must be from 1 to {MAX_BUFFER}")
    if args.traced_successes_per_second < 0:
        parser.error("--traced-successes-per-second must be 0 (trace every call) or more")
    _positive(args.max_answer_bytes, "--max-answer-bytes", parser)
    if not 1 <= args.budget_unbounded_calls <= MAX_UNBOUNDED_CALLS:
        parser.error(f"--budget-unbounded-calls must be from 1 to {MAX_UNBOUNDED_CALLS}")
    if not 1 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be from 1 to {MAX_WORKERS}")
    port = args.router_port if args.command == "up" else args.port
    if args.workers > 1 and port == 0:
        parser.error("--workers N needs a port number: with port 0 each worker would listen on a port of its own")


def router_settings(args: argparse.Namespace, port: int, registry_url: str | None,
                    registry_key: str | None = None) -> RouterServerSettings:
    semantic = SemanticSettings(enabled=args.semantic or getattr(args, "demo", False) or bool(args.embed_model),
                                model=args.semantic_model, threshold=args.semantic_threshold,
                                margin=args.semantic_margin, max_capabilities=args.semantic_max_capabilities,
                                embed_model=args.embed_model or None, embed_prompt=args.embed_prompt)
    return RouterServerSettings(host=args.host, port=port, registry_url=registry_url, registry_key=registry_key,
                                routing=RouterSettings(default_policy=args.default_policy,
                                                       traced_successes_per_second=args.traced_successes_per_second,
                                                       max_answer_bytes=args.max_answer_bytes,
                                                       budget_unbounded_calls=args.budget_unbounded_calls),
                                semantic=semantic,
                                auth=args.auth == "on", keys_dir=args.data_dir / "keys",
                                audit_path=args.data_dir / "audit.db" if args.audit else None,
                                audit_retention_days=args.audit_retention_days,
                                audit_batch_rows=args.audit_batch_rows, agent_networks=args.agent_networks,
                                connections=connection_limits(args), broker=args.broker,
                                otlp_endpoint=args.otlp_endpoint)


def console_settings(args: argparse.Namespace, port: int, registry_url: str, router_url: str) -> ConsoleSettings:
    return ConsoleSettings(host=args.host, port=port, registry_url=registry_url, router_url=router_url,
                           data_dir=args.data_dir, auth=args.auth, admin_key=required_admin_key(args),
                           connections=connection_limits(args), otlp_endpoint=args.otlp_endpoint)

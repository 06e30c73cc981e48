"""`agentreach clients|tokens|admin-key ...`: the registry's admin API from a shell.

Each command is one HTTP call with the admin key; its answer is printed as JSON on stdout (so
`jq` and scripts can read it) and any failure as one line on stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any, get_args
from urllib.parse import quote

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.headers import API_KEY_HEADER
from agent_reach.registration import TrustLevel

from agentreach.credentials import admin_key, default_registry
from auth.records import BudgetPeriod
from registry.access import admin_key_path

TIMEOUT = aiohttp.ClientTimeout(total=15, connect=3)


class Call(msgspec.Struct, frozen=True):
    method: str
    path: str
    body: dict[str, Any] | None = None


class CommandFailed(Exception):
    """One line for stderr, and the exit code to leave with."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", default=default_registry(), metavar="URL",
                        help="the registry (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)")
    add_key_flags(parser)


def add_key_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-key", default=None, metavar="KEY",
                        help="the admin key (default: $AGENTREACH_ADMIN_KEY, else read DATA_DIR/admin.key)")
    parser.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                        help="where admin.key is read from without --admin-key (default: ./.agentreach)")


def _budget_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-tokens", type=int, default=None, metavar="N",
                        help="tokens it may use per period, across every router")
    parser.add_argument("--budget-cost", type=float, default=None, metavar="X",
                        help="cost (the instances' unit-free prices) it may spend per period, across every router")
    parser.add_argument("--budget-period", choices=get_args(BudgetPeriod), default=None,
                        help="the budget's period, a calendar hour, day or month in UTC (needed with a budget)")


def _budget(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The budget flags given, as the API's fields (the registry checks them and names the one at fault; a cost
    JSON cannot carry, nan or inf, is refused here)."""
    if args.budget_cost is not None and not math.isfinite(args.budget_cost):
        parser.error("--budget-cost must be a finite number")
    given = {"budget_tokens": args.budget_tokens, "budget_cost": args.budget_cost,
             "budget_period": args.budget_period}
    return {name: value for name, value in given.items() if value is not None}


def add_commands(commands: Any) -> None:
    """Add the `clients` and `tokens` command groups to the top-level subparsers."""
    clients = commands.add_parser("clients", help="create, list, disable, enable and rotate callers",
                                  description="Manage the mesh's callers (clients) through the registry's admin API.")
    client_commands = clients.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = client_commands.add_parser("create", help="create a client; prints its id, secret and API key once")
    create.add_argument("--name", required=True, help="a label for people")
    create.add_argument("--trust", required=True, choices=get_args(TrustLevel), help="its trust level")
    create.add_argument("--grant", required=True, action="append", metavar="CAP", dest="grants",
                        help="a capability it may call, or a prefix such as order.* (repeat for more)")
    create.add_argument("--rate-limit", type=float, default=None, metavar="QPS",
                        help="calls per second through one router (default: the router's)")
    _budget_flags(create)
    _common(create)
    budget = client_commands.add_parser("budget", help="set a client's budget (no budget flag: remove it)")
    budget.add_argument("client_id", metavar="ID")
    _budget_flags(budget)
    _common(budget)
    listing = client_commands.add_parser("list", help="list every client (never a secret)")
    _common(listing)
    for action, text in (("disable", "refuse its credentials from now on"), ("enable", "accept them again"),
                         ("rotate", "new secret and API key, printed once; the old ones stop working")):
        sub = client_commands.add_parser(action, help=text)
        sub.add_argument("client_id", metavar="ID")
        _common(sub)

    tokens = commands.add_parser("tokens", help="create, list and revoke agent registration tokens",
                                 description="Manage agent registration tokens (one service each).")
    token_commands = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = token_commands.add_parser("create", help="create a token for one service; prints it once")
    create.add_argument("--service", required=True, help="the service whose instances it may register")
    _common(create)
    _common(token_commands.add_parser("list", help="list every token (never the token itself)"))
    revoke = token_commands.add_parser("revoke", help="refuse the token from now on")
    revoke.add_argument("token_id", metavar="ID")
    _common(revoke)

    admin = commands.add_parser("admin-key", help="replace the admin key",
                                description="Replace the registry's admin key: the old one stops working at "
                                            "once; the new one is printed once and written to the registry's "
                                            "DATA_DIR/admin.key. Routers and consoles started with the old key "
                                            "must be restarted with the new one.")
    admin_commands = admin.add_subparsers(dest="action", required=True, metavar="ACTION")
    _common(admin_commands.add_parser("rotate", help="a new admin key, printed once"))


def call_for(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Call:
    """The admin API request a parsed command stands for."""
    if args.command == "admin-key":
        return Call("POST", "/admin-key/rotate")
    if args.command == "tokens":
        if args.action == "create":
            return Call("POST", "/tokens", {"service": args.service})
        if args.action == "list":
            return Call("GET", "/tokens")
        return Call("POST", f"/tokens/{quote(args.token_id, safe='')}/revoke")
    if args.action == "create":
        if args.rate_limit is not None and not (math.isfinite(args.rate_limit) and args.rate_limit > 0):
            parser.error("--rate-limit must be greater than 0")
        body: dict[str, Any] = {"name": args.name, "trust_level": args.trust, "grants": args.grants}
        if args.rate_limit is not None:
            body["rate_limit_qps"] = args.rate_limit
        return Call("POST", "/clients", {**body, **_budget(args, parser)})
    if args.action == "budget":
        return Call("PUT", f"/clients/{quote(args.client_id, safe='')}/budget", _budget(args, parser))
    if args.action == "list":
        return Call("GET", "/clients")
    return Call("POST", f"/clients/{quote(args.client_id, safe='')}/{args.action}")


def refusal(status: int, body: bytes) -> str:
    """The registry's error body as one line: status, code, message and the field at fault."""
    try:
        error = peer_json.decode(body)
    except ValueError:
        error = None
    if not isinstance(error, dict) or "message" not in error:
        return f"the registry answered HTTP {status}"
    field = f" (field: {error['field']})" if error.get("field") else ""
    return f"the registry refused: {status} {error.get('error', '')}: {error['message']}{field}"


class NoAnswer(CommandFailed):
    """The registry could not be reached or gave no answer in time (another registry may)."""


async def exchange(registry: str, key: str | None, call: Call,
                   timeout: aiohttp.ClientTimeout = TIMEOUT) -> tuple[int, bytes]:
    """One request (without a key, for a registry with auth off); the status and body of whatever came back."""
    url = f"{registry.rstrip('/')}{call.path}"
    headers = {API_KEY_HEADER: key} if key else {}
    try:
        # Never followed: a redirect would carry the admin key to wherever it points.
        async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
                call.method, url, json=call.body, headers=headers, allow_redirects=False) as response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise NoAnswer(f"cannot reach the registry at {registry}: {str(exc) or type(exc).__name__}") from None


async def send(registry: str, key: str, call: Call) -> Any:
    return registry_answer(registry, *await exchange(registry, key, call))


def registry_answer(registry: str, status: int, body: bytes) -> Any:
    """The registry's JSON answer; CommandFailed for a refusal or an answer that is not JSON."""
    if status >= 400:
        raise CommandFailed(refusal(status, body))
    try:
        return peer_json.decode(body)
    except ValueError:
        raise CommandFailed(f"the registry at {registry} answered something that is not JSON") from None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not args.registry.startswith(("http://", "https://")):
        parser.error(f"--registry must be an http:// or https:// URL, got {args.registry!r}")
    call = call_for(args, parser)
    key = admin_key(args.admin_key, args.data_dir)
    try:
        if key is None:
            raise CommandFailed(f"no admin key: pass --admin-key, or --data-dir where admin.key lives "
                                f"(looked for {admin_key_path(args.data_dir)})", 2)
        answer = asyncio.run(send(args.registry, key, call))
    except CommandFailed as failure:
        print(f"agentreach: {failure}", file=sys.stderr)
        return failure.code
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0

"""`agentreach a2a add URL --service S`: an A2A agent joins the mesh from its Agent Card, in one command.

The card is read (and must name a JSON-RPC endpoint), then one instance is registered for it: one
capability (``--capability``, else the service's name) with ``protocol: "a2a"``, the card URL as its
endpoint and health URL (the registry probes A2A agents through their card: they send no heartbeats),
the card's description, version and skill examples. The registry takes a registration token for the
service (``--token``, $AGENTREACH_TOKEN), else the admin key, else nothing (auth off).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import msgspec
from agent_reach.headers import API_KEY_HEADER
from agent_reach.registration import Capability, RegisterRequest

from agentreach.admin import TIMEOUT, CommandFailed, add_key_flags, registry_answer
from agentreach.credentials import admin_key, default_registry
from router.a2a.outbound import AgentCardView, CardError, fetch_card, jsonrpc_url

CARD_PATH = "/.well-known/agent-card.json"
TOKEN_ENV = "AGENTREACH_TOKEN"
# What a registration may carry (agent_reach.registration.Capability).
MAX_EXAMPLES, MAX_EXAMPLE_CHARS, MAX_DESCRIPTION_CHARS, MAX_VERSION_CHARS = 64, 1024, 4096, 64


def add_command(commands: Any) -> None:
    a2a = commands.add_parser("a2a", help="register A2A agents as mesh instances",
                              description="A2A (Agent2Agent) agents in the mesh.")
    actions = a2a.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="register an A2A agent from its Agent Card URL",
                             description="Read the agent's card and register it: callers reach it through the "
                                         "router as a capability, plain or streamed.")
    add.add_argument("url", help=f"the agent's card URL, or its base URL (the card is then at {CARD_PATH})")
    add.add_argument("--service", required=True, help="the service it joins (a registration token's)")
    add.add_argument("--capability", default=None, help="the capability name (default: the service's)")
    add.add_argument("--agent-id", default=None, help="its instance id (default: SERVICE-a2a- and a hash of the URL)")
    add.add_argument("--timeout-sla-ms", type=int, default=30_000, help="the capability's SLA (default: 30000)")
    add_joining_flags(add)


def card_url_of(url: str) -> str:
    return url if url.endswith(".json") else url.rstrip("/") + CARD_PATH


def _fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def registration_for(card_url: str, card: AgentCardView, service: str, capability: str | None,
                     agent_id: str | None, timeout_sla_ms: int) -> RegisterRequest:
    """The instance an A2A agent is in the mesh (checked by the same schema as any registration)."""
    examples = [_fit(example, MAX_EXAMPLE_CHARS) for skill in card.skills for example in skill.examples if example]
    description = card.description or " ".join(skill.description for skill in card.skills if skill.description)
    digest = hashlib.sha256(card_url.encode()).hexdigest()[:8]
    request = {
        "agent_id": agent_id or f"{service}-a2a-{digest}", "service": service, "health_url": card_url,
        "metadata": {"a2a_card": _fit(card_url, 256)},
        "capabilities": [msgspec.to_builtins(Capability(
            name=capability or service, endpoint=card_url, protocol="a2a", timeout_sla_ms=timeout_sla_ms,
            version=_fit(re.sub(r"\s", "", card.version), MAX_VERSION_CHARS) or "1.0",
            description=_fit(description, MAX_DESCRIPTION_CHARS), examples=examples[:MAX_EXAMPLES]))],
    }
    try:
        return msgspec.convert(request, RegisterRequest)
    except msgspec.ValidationError as exc:
        raise CommandFailed(f"cannot register this agent: {exc}", 2) from None


async def register(session: aiohttp.ClientSession, registry: str, request: RegisterRequest,
                   credentials: dict[str, str]) -> Any:
    """POST the registration; the registry's answer (CommandFailed for a refusal or no registry)."""
    url = f"{registry.rstrip('/')}/register"
    try:
        # Never followed: a redirect would carry the credential to wherever it points.
        async with session.post(url, data=msgspec.json.encode(request), allow_redirects=False,
                                headers={"Content-Type": "application/json", **credentials}) as response:
            status, body = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CommandFailed(f"cannot reach the registry at {registry}: {exc}") from None
    return registry_answer(registry, status, body)


async def _add(args: argparse.Namespace, credentials: dict[str, str]) -> dict[str, Any]:
    card_url = card_url_of(args.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        try:
            card = await fetch_card(session, card_url, TIMEOUT)
        except CardError as exc:
            raise CommandFailed(f"{card_url}: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CommandFailed(f"cannot read the card at {card_url}: {str(exc) or type(exc).__name__}") from None
        request = registration_for(card_url, card, args.service, args.capability, args.agent_id, args.timeout_sla_ms)
        registered = await register(session, args.registry, request, credentials)
    return {"agent_id": request.agent_id, "service": request.service, "capability": request.capabilities[0].name,
            "card": card_url, "endpoint": jsonrpc_url(card), "agent": card.name,
            "registry": registered}


def add_joining_flags(add: Any) -> None:
    """Where the instance joins and with what credential: the same for every `agentreach X add`."""
    add.add_argument("--registry", default=default_registry(), metavar="URL",
                     help="the registry (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)")
    add.add_argument("--token", default=os.environ.get(TOKEN_ENV), metavar="TOKEN",
                     help=f"a registration token for the service (default: ${TOKEN_ENV}); else the admin key")
    add_key_flags(add)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return run_add(args, parser, _add)


def run_add(args: argparse.Namespace, parser: argparse.ArgumentParser,
            add: Callable[[argparse.Namespace, dict[str, str]], Coroutine[Any, Any, dict[str, Any]]]) -> int:
    """Check the URLs, resolve the credential, run ``add`` and print what it registered."""
    if not args.registry.startswith(("http://", "https://")):
        parser.error(f"--registry must be an http:// or https:// URL, got {args.registry!r}")
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"URL must be an http:// or https:// URL, got {args.url!r}")
    key = None if args.token else admin_key(args.admin_key, args.data_dir)
    credentials = {"Authorization": f"Bearer {args.token}"} if args.token else {API_KEY_HEADER: key} if key else {}
    try:
        answer = asyncio.run(add(args, credentials))
    except CommandFailed as failure:
        print(f"agentreach: {failure}", file=sys.stderr)
        return failure.code
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0

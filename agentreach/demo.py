"""Demo agents for `agentreach up --demo`: a live mesh a new user can call at once.

Three SDK agents in the same process, each with its own ATP endpoint on an ephemeral port:
an echo, a keyword intent detector and an order lookup that calls the intent detector through
the router (so its trace is a tree of two calls).

With auth on, each demo service registers with its own registration token, the order agent calls
through the router as the `demo-orders` client (granted intent.detect only), and a `demo-caller`
client (granted the three demo capabilities) is there for people trying the mesh. Their secrets
are kept in ``DATA_DIR/demo/`` (0600) and reused on the next start, so the same key keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import msgspec
from agent_reach import AgentReachSDK, BusinessFailure, ReachClient

from agentreach.admin import Call, CommandFailed, NoAnswer, send
from agentreach.knobs import add_admin_key, add_auth_switch, required_admin_key
from auth.records import ClientCreate, ClientSecrets, ClientView, IssuedToken, TokenCreate, TokenView
from registry.access import Access
from registry.service import Registry
from wal.private import write_private

T = TypeVar("T")
log = logging.getLogger("agentreach.demo")

_INTENTS = {
    "order.query": ("order", "package", "delivery", "shipped", "订单", "快递"),
    "invoice.create": ("invoice", "bill", "receipt", "发票"),
    "weather.forecast": ("weather", "rain", "sunny", "天气"),
}
_ORDERS = {"A-1001": "shipped", "A-1002": "packing", "A-1003": "delivered"}


def detect_intent(text: str) -> tuple[str, float]:
    """A deliberately small keyword classifier: enough to show routing, not a model."""
    lowered = text.lower()
    scores = {intent: sum(word in lowered for word in words) for intent, words in _INTENTS.items()}
    best = max(scores, key=lambda intent: scores[intent])
    return (best, min(1.0, 0.5 + 0.25 * scores[best])) if scores[best] else ("unknown", 0.0)


DEMO_SERVICES = ("demo-echo", "demo-intent", "demo-orders")
DEMO_CAPABILITIES = ["demo.echo", "intent.detect", "order.query"]
ORDERS_CLIENT, ORDERS_GRANTS = "demo-orders", ["intent.detect"]
CALLER_CLIENT = "demo-caller"


class DemoCredentials(msgspec.Struct, kw_only=True):
    """What the demo agents present with auth on: a registration token per service, and the
    order agent's API key for its calls through the router."""

    tokens: dict[str, str]
    orders_api_key: str
    caller_key_path: Path

    def banner(self, router_url: str) -> str:
        """Where to find the demo caller's key, and a call that uses it; no secret in it."""
        return (f"agentreach: demo caller API key (client {CALLER_CLIENT!r}, may call "
                f"{', '.join(DEMO_CAPABILITIES)}) is in {self.caller_key_path}; try:\n"
                f"  curl -s -X POST {router_url}/atp -H \"X-API-Key: $(cat {self.caller_key_path})\" "
                f"-H 'Content-Type: application/json' -d '{{\"capability\": \"demo.echo\", \"payload\": \"hi\"}}'")


def _write_secret(path: Path, secret: str) -> None:
    write_private(path, (secret + "\n").encode(), replace=True)


def _read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Admin(Protocol):
    """What minting the demo's credentials needs from a registry: in process (``InProcessAdmin``)
    or over its admin HTTP API (``HttpAdmin``), so `up --demo` and `agentreach demo` share one path."""

    async def token_views(self) -> list[TokenView]: ...

    async def client_views(self) -> list[ClientView]: ...

    async def create_token(self, request: TokenCreate) -> IssuedToken: ...

    async def create_client(self, request: ClientCreate) -> ClientSecrets: ...

    async def rotate(self, client_id: str) -> ClientSecrets: ...


class InProcessAdmin:
    """The registry's own Access, for `up --demo`."""

    def __init__(self, access: Access):
        self.access = access
        self.create_token, self.create_client, self.rotate = access.create_token, access.create_client, access.rotate

    async def token_views(self) -> list[TokenView]:
        return self.access.tokens()

    async def client_views(self) -> list[ClientView]:
        return self.access.clients()


class HttpAdmin:
    """The registry's admin API with the admin key; the next registry when one cannot be reached."""

    def __init__(self, registries: list[str], key: str):
        self.registries, self.key = registries, key

    async def _send(self, call: Call, answer: type[T]) -> T:
        unreachable = NoAnswer("no registry given")
        for registry in self.registries:
            try:
                return msgspec.convert(await send(registry, self.key, call), answer)
            except NoAnswer as exc:
                unreachable = exc
        raise unreachable

    async def token_views(self) -> list[TokenView]:
        return (await self._send(Call("GET", "/tokens"), dict[str, list[TokenView]]))["tokens"]

    async def client_views(self) -> list[ClientView]:
        return (await self._send(Call("GET", "/clients"), dict[str, list[ClientView]]))["clients"]

    async def create_token(self, request: TokenCreate) -> IssuedToken:
        return await self._send(Call("POST", "/tokens", msgspec.to_builtins(request)), IssuedToken)

    async def create_client(self, request: ClientCreate) -> ClientSecrets:
        return await self._send(Call("POST", "/clients", msgspec.to_builtins(request)), ClientSecrets)

    async def rotate(self, client_id: str) -> ClientSecrets:
        return await self._send(Call("POST", f"/clients/{quote(client_id, safe='')}/rotate"), ClientSecrets)


class _Minted:
    """Which record each stored secret belongs to (``DATA_DIR/demo-ids.json``): over HTTP a secret cannot
    be looked up, so a stored one is reused only while its record is still there, unchanged."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.ids: dict[str, list[Any]] = msgspec.json.decode(path.read_bytes(), type=dict[str, list[Any]])
        except (OSError, msgspec.DecodeError):
            self.ids = {}

    def record(self, secret_path: Path, secret: str, stamp: list[Any]) -> None:
        _write_secret(secret_path, secret)
        self.ids[secret_path.name] = stamp
        write_private(self.path, msgspec.json.encode(self.ids), replace=True)


async def _service_token(admin: Admin, minted: _Minted, service: str, path: Path) -> str:
    """The stored token when its record is still valid for ``service``, else a new one."""
    token, stamp = _read_secret(path), minted.ids.get(path.name)
    valid = [[view.token_id] for view in await admin.token_views() if view.service == service and not view.revoked]
    if token is not None and stamp in valid:
        return token
    issued = await admin.create_token(TokenCreate(service=service))
    minted.record(path, issued.token, [issued.token_id])
    return issued.token


async def _client_key(admin: Admin, minted: _Minted, name: str, grants: list[str], path: Path) -> str:
    """The stored API key while its client (``name``, enabled) was not rotated since; else that client's key
    rotated (a disabled one stays disabled), or a new client (trust internal) when there is none by that name."""
    key, stamp = _read_secret(path), minted.ids.get(path.name)
    named = [view for view in await admin.client_views() if view.name == name]
    if key is not None and stamp in [[view.client_id, view.rotated_at] for view in named if view.enabled]:
        return key
    if named:
        secrets = await admin.rotate(named[0].client_id)
    else:
        secrets = await admin.create_client(ClientCreate(name=name, trust_level="internal", grants=grants))
    view = next(view for view in await admin.client_views() if view.client_id == secrets.client_id)
    minted.record(path, secrets.api_key, [view.client_id, view.rotated_at])
    return secrets.api_key


async def demo_credentials(registry: Registry, data_dir: Path) -> DemoCredentials:
    """Mint (or reuse) the demo's credentials in process, through the registry's own Access."""
    return await mint_credentials(InProcessAdmin(registry.access), data_dir)


async def mint_credentials(admin: Admin, data_dir: Path) -> DemoCredentials:
    """Mint (or reuse) the demo's credentials through ``admin``; the secrets live in DATA_DIR/demo/."""
    folder, minted = data_dir / "demo", _Minted(data_dir / "demo-ids.json")
    tokens = {service: await _service_token(admin, minted, service, folder / f"{service}.token")
              for service in DEMO_SERVICES}
    orders_key = await _client_key(admin, minted, ORDERS_CLIENT, ORDERS_GRANTS, folder / f"{ORDERS_CLIENT}.key")
    caller_path = folder / f"{CALLER_CLIENT}.key"
    await _client_key(admin, minted, CALLER_CLIENT, DEMO_CAPABILITIES, caller_path)
    return DemoCredentials(tokens=tokens, orders_api_key=orders_key, caller_key_path=caller_path)


def _echo_agent(registry_url: str | list[str], token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-echo-01", registry_url=registry_url, zone="local", service="demo-echo",
                        registration_token=token)

    @sdk.capability("demo.echo", description="Echo the payload back", examples=["say hello back to me"],
                    timeout_sla_ms=5_000)
    async def echo(payload: Any, ctx: Any) -> dict[str, Any]:
        return {"echo": payload, "request_id": ctx.request_id}

    return sdk


def _intent_agent(registry_url: str | list[str], token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id="demo-intent-01", registry_url=registry_url, zone="local", service="demo-intent",
                        metadata={"model": "keywords-v1", "max_qps": 200}, registration_token=token)

    @sdk.capability("intent.detect", version="3.2", description="Classify a user utterance into an intent",
                    examples=["classify the intent of this message", "what does the user want here"],
                    timeout_sla_ms=2_000, idempotent=True)
    async def detect(payload: Any, ctx: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise BusinessFailure("missing_text", "intent.detect expects {\"text\": \"...\"}")
        intent, confidence = detect_intent(payload["text"])
        ctx.report_tokens(len(payload["text"].split()))
        return {"intent": intent, "confidence": confidence}

    return sdk


def _order_agent(registry_url: str | list[str], router_url: str | list[str], token: str | None,
                 api_key: str | None) -> tuple[AgentReachSDK, ReachClient]:
    sdk = AgentReachSDK(agent_id="demo-orders-01", registry_url=registry_url, zone="local", service="demo-orders",
                        metadata={"model": "lookup", "max_qps": 100}, registration_token=token)
    client = ReachClient(router_url, api_key=api_key)

    @sdk.capability("order.query", description="Look up the status of an order by id or from a sentence",
                    examples=["where is order A-1001", "has my package shipped", "track my order",
                              "when will my parcel arrive", "我的订单到哪了"], timeout_sla_ms=5_000)
    async def query(payload: Any, ctx: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise BusinessFailure("bad_payload", "order.query expects a JSON object")
        order_id = payload.get("order_id")
        if order_id is None and isinstance(payload.get("text"), str):
            intent = await client.call("intent.detect", {"text": payload["text"]})
            if intent["intent"] != "order.query":
                raise BusinessFailure("not_an_order_question", f"this reads as {intent['intent']}")
            order_id = next((word for word in payload["text"].split() if word in _ORDERS), None)
        if order_id not in _ORDERS:
            raise BusinessFailure("order_not_found", f"no order {order_id!r}")
        return {"order_id": order_id, "status": _ORDERS[order_id]}

    return sdk, client


class Placement(msgspec.Struct, frozen=True):
    """Where the agents listen and the host others reach them at; port 0: ephemeral ports (`up --demo`),
    else fixed ports P, P+1, P+2 (so compose can expose them)."""

    host: str = "127.0.0.1"
    advertise_host: str | None = None
    port: int = 0

    def base_url(self, index: int) -> str | None:
        return f"http://{self.advertise_host}:{self.port + index}" if self.advertise_host and self.port else None


class DemoAgents:
    """Start and stop the three demo agents together; ``credentials`` None means auth is off."""

    def __init__(self, registry_url: str | list[str], router_url: str | list[str],
                 credentials: DemoCredentials | None = None, placement: Placement | None = None):
        tokens = credentials.tokens if credentials is not None else {}
        orders, self._client = _order_agent(registry_url, router_url, tokens.get("demo-orders"),
                                            credentials.orders_api_key if credentials is not None else None)
        self.agents = [_echo_agent(registry_url, tokens.get("demo-echo")),
                       _intent_agent(registry_url, tokens.get("demo-intent")), orders]

        self.placement = placement or Placement()
        for index, agent in enumerate(self.agents):
            agent.base_url = self.placement.base_url(index)

    async def start(self) -> None:
        """Returns once all three are registered."""
        port = self.placement.port
        await asyncio.gather(*(agent.start(self.placement.host, port + index if port else 0)
                               for index, agent in enumerate(self.agents)))
        log.info("demo agents ready", extra={"agents": [agent.agent_id for agent in self.agents],
                                             "base_urls": [agent.base_url for agent in self.agents]})

    async def stop(self) -> None:
        await asyncio.gather(*(agent.stop() for agent in self.agents))
        await self._client.close()


def add_command(commands: Any) -> None:
    """`agentreach demo`: the demo agents alone, against a running mesh (compose's `demo` service)."""
    demo = commands.add_parser("demo", help="run the three demo agents against a running registry and router",
                               description="Run demo.echo, intent.detect and order.query until signalled; with auth "
                                           "on, their tokens and keys are minted over the registry's admin API.")
    for flag, what, default in (("--registry", "registry", "http://127.0.0.1:8081"),
                                ("--router", "router", "http://127.0.0.1:8080")):
        demo.add_argument(flag, default=default, metavar="URL[,URL...]",
                          help=f"the {what}; several comma-separated, the next when one cannot be reached")
    demo.add_argument("--host", default="127.0.0.1", help="address the agents listen on (default: 127.0.0.1)")
    demo.add_argument("--advertise-host", default=None, metavar="NAME",
                      help="host name routers reach the agents at, with --port (default: the --host address)")
    demo.add_argument("--port", type=int, default=0, metavar="P",
                      help="listen on P, P+1 and P+2 (default: 0, three ephemeral ports)")
    demo.add_argument("--data-dir", type=Path, default=Path(".agentreach"),
                      help="where the demo's secrets are kept (DATA_DIR/demo/) (default: ./.agentreach)")
    demo.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    add_auth_switch(demo, "register with tokens and call with an API key, minted with the admin key")
    add_admin_key(demo)


async def started_from(args: argparse.Namespace) -> DemoAgents:
    """The demo agents of `agentreach demo`, started and registered."""
    if args.advertise_host and not args.port:
        raise CommandFailed("--advertise-host needs --port: the URLs it names carry fixed ports", 2)
    registries, routers = args.registry.split(","), args.router.split(",")
    key = required_admin_key(args)
    credentials = await mint_credentials(HttpAdmin(registries, key), args.data_dir) if key is not None else None
    placement = Placement(host=args.host, advertise_host=args.advertise_host, port=args.port)
    agents = DemoAgents(registries, routers, credentials, placement)
    await agents.start()
    if credentials is not None:
        print(credentials.banner(routers[0]), file=sys.stderr, flush=True)
    return agents

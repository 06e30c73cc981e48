"""Start the mesh's parts (alone, or all together for `agentreach up`) and stop them on a signal."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Protocol, TypeVar

import msgspec

from agentreach.demo import DemoAgents, demo_credentials, started_from
from agentreach.knobs import console_settings, registry_settings, required_admin_key, router_settings
from agentreach.workers import SupervisorLink, WorkerFailed, WorkerPool, check_port_free, new_views, worker_settings
from auth.kek import SecretsKeyError
from console.server import ConsoleServer
from registry.access import admin_key_path
from registry.server import RegistryServer
from router.server import RouterServer, RouterServerSettings
from semantic.settings import SemanticUnavailable
from wal import WalError


class Part(Protocol):
    """A server of the mesh, or the demo agents: started once, stopped once."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


P = TypeVar("P", bound=Part)
Start = Callable[[], Awaitable[Part]]


def _announce_admin_key(registry: RegistryServer) -> None:
    """Show a newly created admin key once, on stderr and never in a log line."""
    if registry.new_admin_key is not None:
        path = admin_key_path(registry.settings.data_dir)
        print(f"agentreach: created the admin key (shown once; stored in {path}, mode 0600):\n"
              f"  {registry.new_admin_key}", file=sys.stderr, flush=True)


async def _serve(*parts: Start) -> None:
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


def _run(*parts: Start) -> int:
    try:
        asyncio.run(_serve(*parts))
    except (WalError, SemanticUnavailable, SecretsKeyError, WorkerFailed,
            OSError) as exc:  # OSError: a full disk, a port taken
        print(f"agentreach: refusing to start: {exc}", file=sys.stderr)
        return 2
    return 0


def _registry_started(registry: RegistryServer) -> Start:
    async def start() -> RegistryServer:
        await registry.start()
        _announce_admin_key(registry)
        return registry
    return start


def _started(server: P) -> Callable[[], Awaitable[P]]:
    async def start() -> P:
        await server.start()
        return server
    return start


def _router_worker(settings: RouterServerSettings, index: int, link: Connection) -> int:
    """One of `--workers N` routers, in its own process (spawned by a WorkerPool)."""
    return _run(_started(RouterServer(worker_settings(settings, index))), _started(SupervisorLink(link)))


async def _start_workers(settings: RouterServerSettings, count: int) -> WorkerPool:
    check_port_free(settings.host, settings.port)
    views = new_views(count)
    settings = msgspec.structs.replace(settings, views=views)
    return await _started(WorkerPool(partial(_router_worker, settings), count, views.directory))()


def _up(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    registry = RegistryServer(registry_settings(args, args.registry_port, parser))
    router_url = f"http://{args.host}:{args.router_port}"

    async def start_router() -> RouterServer:
        # The router follows the registry's hub, which exists once the registry has started, and
        # publishes its token verifying keys straight into it (so routers started elsewhere accept its tokens);
        # reported intents, canary rollbacks and budget leases go straight into it too.
        assert registry.registry is not None
        return await _started(RouterServer(router_settings(args, args.router_port, None), hub=registry.hub,
                                           publish_keys=registry.registry.access.publish_keys,
                                           report_confirmation=registry.registry.examples.confirm,
                                           write_policy=registry.registry.put_policy,
                                           lease_budget=registry.registry.budgets.lease))()

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
        return await _started(ConsoleServer(console_settings(args, args.console_port, registry.url, router_url)))()

    async def start_workers() -> WorkerPool:
        # Router processes follow the registry over HTTP, with the admin key it has written by now.
        return await _start_workers(router_settings(args, args.router_port, registry.url, required_admin_key(args)),
                                    args.workers)

    parts = [_registry_started(registry), start_router if args.workers == 1 else start_workers]
    if args.demo:
        parts.append(start_demo)
    parts.append(start_console)
    return _run(*parts)


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the part (or, for `up`, every part) the parsed command names until it is signalled."""
    if args.command == "up":
        return _up(args, parser)
    if args.command == "demo":
        return _run(partial(started_from, args))
    if args.command == "console":
        return _run(_started(ConsoleServer(console_settings(args, args.port, args.registry, args.router))))
    if args.command == "router" and args.workers > 1:
        settings = router_settings(args, args.port, args.registry, required_admin_key(args))
        return _run(partial(_start_workers, settings, args.workers))
    if args.command == "router":
        return _run(_started(RouterServer(router_settings(args, args.port, args.registry,
                                                          required_admin_key(args)))))
    return _run(_registry_started(RegistryServer(registry_settings(args, args.port, parser))))

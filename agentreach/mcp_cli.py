"""`agentreach mcp add URL --service S [--tool T]... [--prefix P] [--registry URL]`: an MCP server joins the mesh.

The server's ``tools/list`` is read (over Streamable HTTP), then one instance is registered for it: each
chosen tool (every one by default) a capability named as the tool (after ``--prefix``), ``protocol: "mcp"``,
the server's URL with the tool's name as the endpoint's fragment, the tool's description, its input and
output schemas and its idempotent hint. The registry pings the server (MCP ``ping``) in place of heartbeats.
Credentials as for `agentreach a2a add`.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import aiohttp
import msgspec
from agent_reach.registration import RegisterRequest

from agentreach.a2a_cli import MAX_DESCRIPTION_CHARS, add_joining_flags, register, run_add
from agentreach.admin import TIMEOUT, CommandFailed
from mesh import mcp_client
from mesh.mcp_client import McpFailure

MAX_TOOLS = 256  # a registration's capabilities at most (agent_reach.registration.RegisterRequest)


def add_command(commands: Any) -> None:
    mcp = commands.add_parser("mcp", help="register MCP servers' tools as mesh capabilities",
                              description="MCP (Model Context Protocol) servers in the mesh.")
    actions = mcp.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="register an MCP server's tools from its Streamable HTTP URL",
                             description="Read the server's tools and register them: callers reach each through "
                                         "the router as a capability.")
    add.add_argument("url", help="the server's Streamable HTTP endpoint (e.g. http://127.0.0.1:8000/mcp)")
    add.add_argument("--service", required=True, help="the service it joins (a registration token's)")
    add.add_argument("--tool", action="append", default=[], metavar="T",
                     help="a tool to register (repeat for more; default: every tool the server lists)")
    add.add_argument("--prefix", default="", metavar="P", help="put before each tool's name to make the capability's")
    add.add_argument("--agent-id", default=None, help="its instance id (default: SERVICE-mcp- and a hash of the URL)")
    add.add_argument("--timeout-sla-ms", type=int, default=30_000, help="each capability's SLA (default: 30000)")
    add_joining_flags(add)


async def list_tools(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """Every tool the server lists, page after page."""
    session_id = await mcp_client.begin(session, url, TIMEOUT)
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while len(tools) <= MAX_TOOLS:
        result, _ = await mcp_client.request(session, url, session_id, "tools/list",
                                             {"cursor": cursor} if cursor else {}, TIMEOUT)
        tools += [tool for tool in result.get("tools", []) if isinstance(tool, dict)]
        cursor = result.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return tools
    raise CommandFailed(f"{url} lists more than {MAX_TOOLS} tools: choose some with --tool")


def registration_for(url: str, tools: list[dict[str, Any]], args: argparse.Namespace) -> RegisterRequest:
    listed = {tool.get("name"): tool for tool in tools}
    missing = [name for name in args.tool if name not in listed]
    if missing:
        raise CommandFailed(f"{url} has no tool {', '.join(map(repr, missing))}; it lists "
                            f"{', '.join(sorted(map(str, listed))) or 'none'}", 2)
    chosen = [listed[name] for name in args.tool] if args.tool else tools
    if not chosen:
        raise CommandFailed(f"{url} lists no tools", 2)
    capabilities = []
    for tool in chosen:
        capability: dict[str, Any] = {
            "name": f"{args.prefix}{tool['name']}", "endpoint": f"{url}#{tool['name']}", "protocol": "mcp",
            "timeout_sla_ms": args.timeout_sla_ms,
            "description": str(tool.get("description") or "")[:MAX_DESCRIPTION_CHARS],
            "idempotent": (tool.get("annotations") or {}).get("idempotentHint") is True}
        for key, schema in (("input_schema", tool.get("inputSchema")), ("output_schema", tool.get("outputSchema"))):
            if isinstance(schema, dict):
                capability[key] = schema
        capabilities.append(capability)
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    request = {"agent_id": args.agent_id or f"{args.service}-mcp-{digest}", "service": args.service,
               "capabilities": capabilities, "metadata": {"mcp_server": url[:256]}}
    try:
        return msgspec.convert(request, RegisterRequest)
    except msgspec.ValidationError as exc:
        raise CommandFailed(f"cannot register these tools: {exc}", 2) from None


async def _add(args: argparse.Namespace, credentials: dict[str, str]) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        try:
            tools = await list_tools(session, args.url)
        except (McpFailure, aiohttp.ClientError, TimeoutError) as exc:
            raise CommandFailed(f"cannot list the tools of {args.url}: {str(exc) or type(exc).__name__}") from None
        request = registration_for(args.url, tools, args)
        registered = await register(session, args.registry, request, credentials)
    return {"agent_id": request.agent_id, "service": request.service,
            "capabilities": [capability.name for capability in request.capabilities], "server": args.url,
            "registry": registered}


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return run_add(args, parser, _add)

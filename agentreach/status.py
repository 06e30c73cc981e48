"""`agentreach status`: the cluster as one registry node sees it (its `GET /cluster`), for people and scripts.

The registries are asked in the order given and the first that answers is shown. The exit code tells a
script or a probe whether the mesh can be trusted now without parsing the table: no registry answering,
a view its own node knows is stale, and nobody leading (no health sweeps, no evictions) each fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import msgspec
from agent_reach import peer_json
from agent_reach.transport import url_list

from agentreach.admin import Call, CommandFailed, NoAnswer, add_key_flags, exchange, refusal
from agentreach.credentials import admin_key, default_registry
from mesh.cluster import ClusterView, EtcdEndpoint, NodeView

CLUSTER = Call("GET", "/cluster")
# Shorter than the admin commands' deadline: a hung node should not hold up asking the next one.
TIMEOUT = aiohttp.ClientTimeout(total=5, connect=2)
NO_KEY_HINT = (" (no admin key was sent: pass --admin-key, set AGENTREACH_ADMIN_KEY, or --data-dir where admin.key "
               "lives)")
EXIT_UNANSWERED = 1
EXIT_NO_LEADER = 3
EXIT_STALE = 4
_view = peer_json.Decoder(ClusterView)


class Problem(msgspec.Struct, frozen=True):
    exit_code: int
    message: str


class Answer(msgspec.Struct, frozen=True):
    """The first registry that answered, its view as sent and as read, and why the ones before it did not."""

    url: str
    body: bytes
    view: ClusterView
    skipped: list[str]


def add_command(commands: Any) -> None:
    status = commands.add_parser(
        "status", help="the registry nodes, the leader, etcd's health and the routers, from a registry's /cluster",
        description="Show the cluster as the first registry that answers sees it: its nodes (the leader and the "
                    "node asked marked), the etcd endpoints with their health and round-trip time, and the routers "
                    "with their share of every limit.",
        epilog=f"Exit codes: 0 all well; {EXIT_UNANSWERED} no registry answered (or one refused); 2 no admin key "
               f"or a bad flag; {EXIT_NO_LEADER} nobody leads; {EXIT_STALE} the answering node's view is stale "
               "(it is cut off from etcd). The reason is on stderr.")
    status.add_argument("--registry", default=default_registry(), metavar="URL[,URL...]",
                        help="registries to ask, the first that answers is shown (default: $AGENTREACH_REGISTRY, "
                             "else http://127.0.0.1:8081)")
    add_key_flags(status)
    status.add_argument("--json", action="store_true", help="print the registry's /cluster answer as JSON")


def problems(view: ClusterView) -> list[Problem]:
    """What is wrong with the cluster as this view shows it; a stale view first, since it may explain the rest."""
    found = []
    if view.stale_seconds is not None:
        others = ", ".join(node.url for node in view.nodes if not node.this_node)
        found.append(Problem(EXIT_STALE, f"node {view.node_id}'s view is stale: last known current "
                                         f"{span(view.stale_seconds)} ago (cut off from etcd); ask another registry"
                                         + (f" ({others})" if others else "")))
    if view.leader is None:
        found.append(Problem(EXIT_NO_LEADER, "nobody leads: no health sweep or eviction runs until a node takes "
                                             "the lead"))
    return found


def span(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 86400 else f"{seconds / 86400:.1f} d"


def percent(share: float) -> str:
    return f"{share * 100:.1f}".removesuffix(".0") + " %"


def clip(text: str, limit: int = 60) -> str:
    """A reason on one table line (an etcd client error can run to hundreds of characters; --json has it whole)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns under their header, indented under a section title."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in (header, *rows)]


def node_row(node: NodeView, now: float) -> list[str]:
    heard = "this node" if node.this_node else "never" if node.last_heard is None else f"{span(node.last_heard)} ago"
    return [node.node_id + (" (this node)" if node.this_node else ""), node.url,
            "leader" if node.leader else "follower", span(max(0.0, now - node.started_at)), heard]


def endpoint_row(endpoint: EtcdEndpoint) -> list[str]:
    if endpoint.healthy:
        return [endpoint.url, "ok", "—" if endpoint.rtt_ms is None else f"{endpoint.rtt_ms:.1f} ms"]
    return [endpoint.url, "DOWN", clip(endpoint.error or "—")]


def render(url: str, view: ClusterView, now: float) -> str:
    """The view as a compact text table."""
    store = "etcd store" if view.store == "etcd" else "embedded store (its own write-ahead log)"
    leader = "NONE: nobody leads" if view.leader is None else view.leader + (
        " (this node)" if view.leader == view.node_id else "") + (
        "" if view.stale_seconds is None else " as last known")
    current = "current" if view.stale_seconds is None else f"STALE: last known current {span(view.stale_seconds)} ago"
    lines = [f"Cluster as registry node {view.node_id} at {url} sees it: {store}, {view.instances} live instances",
             f"Leader: {leader}", f"View:   {current}", "", f"Registry nodes ({len(view.nodes)})",
             *columns(["NODE", "URL", "ROLE", "UP", "LAST HEARD"], [node_row(node, now) for node in view.nodes]), ""]
    if view.etcd:
        lines += [f"etcd endpoints ({sum(e.healthy for e in view.etcd)} of {len(view.etcd)} healthy)",
                  *columns(["ENDPOINT", "HEALTH", "RTT"], [endpoint_row(endpoint) for endpoint in view.etcd])]
    else:
        lines.append("etcd endpoints: none" + (" (embedded store)" if view.store == "wal" else ""))
    lines.append("")
    if view.routers:
        lines += [f"Routers ({len(view.routers)})", *columns(
            ["ROUTER", "FOLLOWS", "SHARE"], [[r.router_id, r.node_id, percent(r.share)] for r in view.routers])]
    else:
        lines.append("Routers: none announced")
    return "\n".join(lines)


async def ask(urls: list[str], key: str | None) -> Answer:
    """The first registry in ``urls`` that answers /cluster; one that refuses the request ends the search,
    since every node holds the same admin key. No key: the registry may have auth off."""
    skipped: list[str] = []
    for url in urls:
        try:
            status, body = await exchange(url, key, CLUSTER, TIMEOUT)
        except NoAnswer as exc:
            skipped.append(str(exc))
            continue
        if status >= 500:
            skipped.append(f"{url}: {refusal(status, body)}")
            continue
        if status >= 400:
            hint = NO_KEY_HINT if status == 401 and key is None else ""
            raise CommandFailed(f"{url}: {refusal(status, body)}{hint}")
        try:
            return Answer(url=url, body=body, view=_view.decode(body), skipped=skipped)
        except msgspec.DecodeError as exc:
            raise CommandFailed(f"{url} answered something that is not a cluster view: {exc}") from None
    raise CommandFailed("no registry answered: " + "; ".join(skipped), EXIT_UNANSWERED)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        urls = url_list(args.registry)
    except ValueError:
        parser.error("--registry needs at least one URL")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            parser.error(f"--registry must be http:// or https:// URLs, got {url!r}")
    try:
        answer = asyncio.run(ask(urls, admin_key(args.admin_key, args.data_dir)))
    except CommandFailed as failure:
        print(f"agentreach: {failure}", file=sys.stderr)
        return failure.code
    for reason in answer.skipped:
        print(f"agentreach: {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(json.loads(answer.body), indent=2, ensure_ascii=False))
    else:
        print(render(answer.url, answer.view, time.time()))
    found = problems(answer.view)
    for problem in found:
        print(f"agentreach: {problem.message}", file=sys.stderr)
    return found[0].exit_code if found else 0

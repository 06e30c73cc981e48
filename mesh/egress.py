"""Where the mesh may send agents' calls: the operator's egress rule (``--agent-networks``, docs/security.md).

A registrant chooses the URLs the router posts calls to and the registry probes, so without a rule
they could aim them at a cloud's metadata service or anything else on the mesh's own network. The
rule is judged at registration (registry/egress.py) and again when a connection opens, after name
resolution (mesh/egress_client.py): a name pointed elsewhere after it was registered gains nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NETWORKS_ENV = "AGENTREACH_AGENT_NETWORKS"
# Refused even with no rule, unless a listed network lies inside them: the link-local ranges (where
# clouds answer metadata requests, 169.254.169.254 and the like) and the metadata addresses outside them.
GUARDED: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(text) for text in (
    "169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32"))
GUARDED_NOTE = "(link-local or a cloud metadata address), refused unless --agent-networks names it"
# NAT64's well-known prefix (RFC 6052): its last 32 bits are the IPv4 address a NAT64 gateway connects to.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# The networks a refusal names; past these, how many more.
NAMED_IN_REASONS = 4
# A name still unresolved after this is refused: a registration does not wait on a slow DNS server.
RESOLVE_TIMEOUT_S = 5.0
# Verdicts a process keeps, by host: more than any mesh's agents' hosts; past it they are judged afresh.
MAX_VERDICTS = 8192


def parse_networks(text: str) -> tuple[str, ...]:
    """``CIDR[,CIDR...]`` as the operator wrote it, each checked (a bare address is its /32 or /128);
    raises ValueError naming the one that is no network. Empty: no rule (only GUARDED refused)."""
    networks = []
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        try:
            networks.append(str(ipaddress.ip_network(part)))
        except ValueError as exc:
            raise ValueError(f"{part!r} is not a network ({exc})") from None
    return tuple(networks)


def _named(networks: tuple[IPNetwork, ...]) -> str:
    shown = ", ".join(str(network) for network in networks[:NAMED_IN_REASONS])
    more = len(networks) - NAMED_IN_REASONS
    return shown + (f" and {more} more" if more > 0 else "")


def _inside(network: IPNetwork, outer: IPNetwork) -> bool:
    """Whether ``network`` lies within ``outer`` (False across IPv4 and IPv6)."""
    return network.network_address in outer and network.broadcast_address in outer


def _reached(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one is, written as IPv6: mapped (``::ffff:a.b.c.d``) or translated by NAT64's
    well-known prefix (``64:ff9b::a.b.c.d``, RFC 6052), where a NAT64 gateway connects to exactly that IPv4
    address; else the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def _tunnels(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses a 6to4 (RFC 3056) or Teredo (RFC 4380) address carries: where its packets go first."""
    if not isinstance(address, ipaddress.IPv6Address):
        return ()
    if address.sixtofour is not None:
        return (address.sixtofour,)
    return address.teredo or ()


def _guarded(address: IPAddress, networks: tuple[IPNetwork, ...]) -> IPNetwork | None:
    """The GUARDED range that refuses ``address``: None when it is in none, or a listed network opens it."""
    guarded = next((network for network in GUARDED if address in network), None)
    if guarded is None or any(address in network and _inside(network, guarded) for network in networks):
        return None
    return guarded


def refusal(address: IPAddress, networks: tuple[IPNetwork, ...]) -> str | None:
    """Why the rule refuses ``address``; None when the mesh may connect to it. With no ``networks``
    every address but GUARDED ones may be reached; a GUARDED one only when a listed network lies inside
    its guarded range (``0.0.0.0/0`` does not open 169.254.169.254; ``169.254.169.254/32`` does).
    An IPv4 address written as IPv6 (``::ffff:a.b.c.d``, ``64:ff9b::a.b.c.d``) is judged as the IPv4 address
    it reaches, and a tunnel's address (6to4, Teredo) is refused when the IPv4 address it carries is GUARDED."""
    address = _reached(address)
    guarded = _guarded(address, networks)
    if guarded is not None:
        return f"{address} is in {guarded} {GUARDED_NOTE}"
    for carried in _tunnels(address):
        guarded = _guarded(carried, networks)
        if guarded is not None:
            return f"{address} tunnels through {carried}, in {guarded} {GUARDED_NOTE}"
    if not networks or any(address in network for network in networks):
        return None
    return f"{address} is outside --agent-networks ({_named(networks)})"


class Egress:
    """The rule as one process holds it: the networks parsed once, and each host's verdict kept (the
    rule does not change while the process runs, and agents' hosts repeat call after call)."""

    def __init__(self, networks: Iterable[str] = ()):
        self.networks: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(network) for network in networks)
        self._verdicts: dict[str, str | None] = {}

    def address_refusal(self, address: str) -> str | None:
        """The verdict on one address, as a resolver or a URL writes it."""
        try:
            return refusal(ipaddress.ip_address(address), self.networks)
        except ValueError:
            return f"{address!r} is not an address the egress rule can judge"

    def host_refusal(self, host: str) -> str | None:
        """A URL's host: the verdict when it is an address (connected to without resolving); None for a
        name, judged once resolved. Cached per host."""
        if host in self._verdicts:
            return self._verdicts[host]
        verdict = self.address_refusal(host) if is_address(host) else None
        if len(self._verdicts) >= MAX_VERDICTS:
            self._verdicts.clear()
        self._verdicts[host] = verdict
        return verdict


def is_address(host: str) -> bool:
    """Whether a URL's host is an address rather than a name, as aiohttp tells them apart (it resolves
    only names, and refuses numeric hosts that are no canonical address, such as ``127.1``)."""
    return ":" in host or host.replace(".", "").isdigit()


async def _resolved(host: str, port: int) -> list[str] | str:
    """The addresses ``host`` resolves to, or why it does not."""
    try:
        found = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    except TimeoutError:
        return f"{host} did not resolve within {RESOLVE_TIMEOUT_S:.0f} s"
    except (OSError, UnicodeError) as exc:
        return f"{host} does not resolve ({exc})"
    return [str(address[4][0]) for address in found]


async def host_verdict(egress: Egress, host: str, port: int) -> tuple[str, str] | None:
    """(error code, reason) when the rule refuses ``host`` (a registration's URL, the router's broker); None when
    every address it has is allowed. A name that does not resolve is refused: where it points is unknown."""
    if is_address(host):
        reason = egress.address_refusal(host)
        return ("address_refused", reason) if reason is not None else None
    addresses = await _resolved(host, port)
    if isinstance(addresses, str):
        return "host_unresolved", addresses
    for address in addresses:
        reason = egress.address_refusal(address)
        if reason is not None:
            return "address_refused", f"{host} resolves to {reason}"
    return None

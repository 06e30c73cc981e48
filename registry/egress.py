"""A registration's URLs held to the egress rule (mesh/egress.py) before anything is stored.

An address is judged as it is; a name is resolved (off the event loop) and every address it has must
be allowed, since the router may connect to any of them. A name that does not resolve here is refused
too: the registry cannot tell where it points. The router judges again when it connects.
"""

from __future__ import annotations

import asyncio
import socket

from yarl import URL

from mesh.egress import Egress, is_address
from mesh.records import InstanceRecord
from weblayer.errors import ApiError

# A name still unresolved after this is refused: a registration does not wait on a slow DNS server.
RESOLVE_TIMEOUT_S = 5.0


def destinations(record: InstanceRecord) -> list[tuple[str, str]]:
    """Every URL the mesh may connect to for this instance, with the field it came from."""
    urls = [("base_url", record.base_url)] if record.base_url is not None else []
    urls += [(f"capabilities[{position}].endpoint",
              f"grpc://{capability.endpoint}" if capability.protocol == "grpc" else capability.endpoint)
             for position, capability in enumerate(record.capabilities)]
    return [*urls, ("health_url", record.health_url)]


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


async def _verdict(egress: Egress, host: str, port: int) -> tuple[str, str] | None:
    """(error code, reason) when the rule refuses ``host``; None when every address it has is allowed."""
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


async def check_destinations(record: InstanceRecord, egress: Egress) -> None:
    """400 naming the first field whose URL the rule refuses (or whose host does not resolve)."""
    urls = [(field, URL(url)) for field, url in destinations(record)]
    hosts = sorted({(url.raw_host or "", url.port or 0) for _, url in urls})
    verdicts = dict(zip(hosts, await asyncio.gather(*(_verdict(egress, host, port) for host, port in hosts)),
                        strict=True))
    for field, url in urls:
        verdict = verdicts[(url.raw_host or "", url.port or 0)]
        if verdict is not None:
            code, reason = verdict
            raise ApiError(400, code, f"{field} {str(url)!r} may not be an agent's address: {reason}", field)

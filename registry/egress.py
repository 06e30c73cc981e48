"""A registration's URLs held to the egress rule (mesh/egress.py) before anything is stored.

An address is judged as it is; a name is resolved (off the event loop) and every address it has must
be allowed, since the router may connect to any of them. A name that does not resolve here is refused
too: the registry cannot tell where it points. The router judges again when it connects.
"""

from __future__ import annotations

import asyncio

from yarl import URL

from mesh.egress import Egress, host_verdict
from mesh.records import InstanceRecord
from weblayer.errors import ApiError


def destinations(record: InstanceRecord) -> list[tuple[str, str]]:
    """Every URL the mesh may connect to for this instance, with the field it came from."""
    urls = [("base_url", record.base_url)] if record.base_url is not None else []
    urls += [(f"capabilities[{position}].endpoint",
              f"grpc://{capability.endpoint}" if capability.protocol == "grpc" else capability.endpoint)
             for position, capability in enumerate(record.capabilities)]
    return [*urls, ("health_url", record.health_url)]


async def check_destinations(record: InstanceRecord, egress: Egress) -> None:
    """400 naming the first field whose URL the rule refuses (or whose host does not resolve)."""
    urls = [(field, URL(url)) for field, url in destinations(record)]
    hosts = sorted({(url.raw_host or "", url.port or 0) for _, url in urls})
    verdicts = dict(zip(hosts, await asyncio.gather(*(host_verdict(egress, host, port) for host, port in hosts)),
                        strict=True))
    for field, url in urls:
        verdict = verdicts[(url.raw_host or "", url.port or 0)]
        if verdict is not None:
            code, reason = verdict
            raise ApiError(400, code, f"{field} {str(url)!r} may not be an agent's address: {reason}", field)

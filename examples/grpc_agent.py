"""An agent the router reaches over gRPC (``protocol="grpc"``, the agentreach.v1.Agent service in
agent_reach/proto/agent.proto): `demo.grpc.echo` echoes its payload, streaming it word by word to a caller that
asks for a stream. Nothing else differs from an HTTP agent: the same handler, signature checks, deadlines and
drain; the registry probes it with the standard grpc.health.v1.Health service (docs/protocols.md).

    agentreach up                      # the mesh, auth on (in another terminal, same directory)
    export AGENTREACH_TOKEN=$(agentreach tokens create --service grpc-echo | jq -r .token)
    python examples/grpc_agent.py --registry http://127.0.0.1:8081
    export AGENTREACH_API_KEY=$(agentreach clients create --name me --trust internal --grant 'demo.grpc.*' \
        | jq -r .api_key)
    python examples/caller.py demo.grpc.echo '{"text": "hello over gRPC"}'

Ctrl-C (or SIGTERM) deregisters the agent and lets calls in flight finish first.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from typing import Any

from agent_reach import AgentReachSDK, BusinessFailure, logs


def build(agent_id: str, registry_url: str, heartbeat_interval: float, token: str | None,
          grpc_port: int) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id=agent_id, registry_url=registry_url, zone="local", service="grpc-echo",
                        registration_token=token, heartbeat_interval=heartbeat_interval, grpc_port=grpc_port)

    @sdk.capability("demo.grpc.echo", protocol="grpc", idempotent=True, timeout_sla_ms=10_000,
                    description="Echo the payload back over gRPC; streamed word by word on request",
                    examples=['{"text": "hello over gRPC"}'])
    async def echo(payload: Any, ctx: Any) -> AsyncIterator[dict[str, Any]]:
        if not isinstance(payload, dict):
            raise BusinessFailure("not_an_object", "demo.grpc.echo expects a JSON object")
        words = str(payload.get("text", "")).split()
        for n, word in enumerate(words[:-1]):
            yield {"word": word, "n": n}
        yield {"echo": payload, "request_id": ctx.request_id, "served_by": agent_id}

    return sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=os.environ.get("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"),
                        help="registry URL (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)")
    parser.add_argument("--token", default=os.environ.get("AGENTREACH_TOKEN"),
                        help="registration token (default: $AGENTREACH_TOKEN; none needed with auth off)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9003, help="the agent's HTTP port (/healthz); 0 picks a free one")
    parser.add_argument("--grpc-port", type=int, default=9004, help="the gRPC port; 0 picks a free one")
    parser.add_argument("--agent-id", default="grpc-echo-01")
    parser.add_argument("--heartbeat-interval", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args()
    logs.configure()
    build(args.agent_id, args.registry, args.heartbeat_interval, args.token, args.grpc_port).serve(args.host, args.port)


if __name__ == "__main__":
    main()

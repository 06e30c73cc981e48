"""An agent the router reaches through a message broker (``protocol="mq"``, Redis Streams): `demo.mq.echo`
echoes its payload, streaming it word by word to a caller that asks for a stream. The router never dials the
agent: the agent takes its calls from the broker and answers there. Every instance started with the same
--service reads one request stream in one consumer group: the calls are shared, and a call an instance died
holding goes to a sibling. Every instance of one service must join with the same registration token (the router
signs a call with the key of the instance it picked, and any instance may take it). Nothing else differs from an
HTTP agent: the same handler, signature checks, deadlines and drain (docs/protocols.md).

    redis-server --port 6379 --save '' --appendonly no     # the broker (or: docker run -p 6379:6379 redis:7)
    agentreach up --broker redis://127.0.0.1:6379          # the mesh, auth on (same directory from here on)
    export AGENTREACH_TOKEN=$(agentreach tokens create --service mq-echo | jq -r .token)
    python examples/mq_agent.py --registry http://127.0.0.1:8081 --broker redis://127.0.0.1:6379
    export AGENTREACH_API_KEY=$(agentreach clients create --name me --trust internal --grant 'demo.mq.*' \
        | jq -r .api_key)
    python examples/caller.py demo.mq.echo '{"text": "hello over a broker"}'

Ctrl-C (or SIGTERM) deregisters the agent, stops taking calls and lets calls in flight finish first.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from typing import Any

from agent_reach import AgentReachSDK, BusinessFailure, logs

BROKER_ENV = "AGENTREACH_BROKER"


def build(agent_id: str, registry_url: str, broker: str, service: str, heartbeat_interval: float,
          token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id=agent_id, registry_url=registry_url, zone="local", service=service,
                        registration_token=token, heartbeat_interval=heartbeat_interval, broker=broker)

    # The SLA outlasts the visibility timeout (10 s) and a sweep (a third of it): a call whose instance died has
    # time to be claimed and answered by a sibling before the router gives up on it.
    @sdk.capability("demo.mq.echo", protocol="mq", idempotent=True, timeout_sla_ms=20_000,
                    description="Echo the payload back through the message broker; streamed word by word on request",
                    examples=['{"text": "hello over a broker"}'])
    async def echo(payload: Any, ctx: Any) -> AsyncIterator[dict[str, Any]]:
        if not isinstance(payload, dict):
            raise BusinessFailure("not_an_object", "demo.mq.echo expects a JSON object")
        words = str(payload.get("text", "")).split()
        for n, word in enumerate(words[:-1]):
            yield {"word": word, "n": n}
        yield {"echo": payload, "request_id": ctx.request_id, "served_by": agent_id}

    return sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=os.environ.get("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"),
                        help="registry URL (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)")
    parser.add_argument("--broker", default=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379"),
                        metavar="redis://HOST:PORT",
                        help="the broker the router was started with (its --broker), as the router reaches it "
                             f"(default: ${BROKER_ENV}, else redis://127.0.0.1:6379)")
    parser.add_argument("--token", default=os.environ.get("AGENTREACH_TOKEN"),
                        help="registration token (default: $AGENTREACH_TOKEN; none needed with auth off)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9005,
                        help="the agent's HTTP port, for the registry's /healthz probe only; 0 picks a free one")
    parser.add_argument("--agent-id", default="mq-echo-01")
    parser.add_argument("--service", default="mq-echo",
                        help="instances of one service share one request stream (default: mq-echo)")
    parser.add_argument("--heartbeat-interval", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args()
    logs.configure()
    build(args.agent_id, args.registry, args.broker, args.service, args.heartbeat_interval,
          args.token).serve(args.host, args.port)


if __name__ == "__main__":
    main()

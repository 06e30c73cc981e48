"""The smallest Agent Reach agent: one capability, `demo.echo`, served over ATP.

    agentreach up                      # the mesh, auth on (in another terminal, same directory)
    export AGENTREACH_TOKEN=$(agentreach tokens create --service echo | jq -r .token)
    python examples/echo_agent.py      # this agent on :9001, registered as echo-agent-01
    export AGENTREACH_API_KEY=$(agentreach clients create --name me --trust internal --grant demo.echo | jq -r .api_key)
    python examples/caller.py demo.echo '{"text": "hello"}'

Ctrl-C (or SIGTERM) deregisters the agent and lets calls in flight finish first.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from agent_reach import AgentReachSDK, BusinessFailure, logs


def build(agent_id: str, registry_url: str, heartbeat_interval: float, token: str | None) -> AgentReachSDK:
    sdk = AgentReachSDK(agent_id=agent_id, registry_url=registry_url, zone="local", registration_token=token,
                        heartbeat_interval=heartbeat_interval, direct_fallback=True)

    @sdk.capability("demo.echo", version="1.0", description="Echo the payload back, after an optional delay_s",
                    examples=['{"text": "hello"}', '{"text": "slow", "delay_s": 2}'], timeout_sla_ms=10_000)
    async def echo(payload: dict, ctx) -> dict:
        if not isinstance(payload, dict):
            raise BusinessFailure("not_an_object", "demo.echo expects a JSON object")
        await asyncio.sleep(float(payload.get("delay_s", 0)))
        return {"echo": payload, "request_id": ctx.request_id, "trace_id": ctx.trace_id}

    return sdk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=os.environ.get("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"),
                        help="registry URL (default: $AGENTREACH_REGISTRY, else http://127.0.0.1:8081)")
    parser.add_argument("--token", default=os.environ.get("AGENTREACH_TOKEN"),
                        help="registration token (default: $AGENTREACH_TOKEN; none needed with auth off)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001, help="0 picks a free port")
    parser.add_argument("--agent-id", default="echo-agent-01")
    parser.add_argument("--heartbeat-interval", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args()
    logs.configure()
    build(args.agent_id, args.registry, args.heartbeat_interval, args.token).serve(args.host, args.port)


if __name__ == "__main__":
    main()

"""Call a capability through the mesh from a script, and see how it was routed.

    export AGENTREACH_API_KEY=$(agentreach clients create --name me --trust internal --grant demo.echo | jq -r .api_key)
    python examples/caller.py demo.echo '{"text": "hello"}'
    python examples/caller.py intent.detect '{"text": "I want a refund", "session_id": "s-1"}'

With the router down, the call falls back to an agent registered with direct_fallback (found
through the registry, asked with the registration token in $AGENTREACH_TOKEN) and the printed
route says ``"degraded": true``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import msgspec
from agent_reach import ReachError, SyncReachClient, logs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capability")
    parser.add_argument("payload", type=json.loads, help="the payload, as JSON")
    parser.add_argument("--router", default="http://127.0.0.1:8080", help="router URL")
    parser.add_argument("--registry", default=os.environ.get("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"),
                        help="registry URL, for direct fallback (default: $AGENTREACH_REGISTRY, else :8081)")
    parser.add_argument("--api-key", default=os.environ.get("AGENTREACH_API_KEY"),
                        help="the caller's API key (default: $AGENTREACH_API_KEY; none needed with auth off)")
    parser.add_argument("--registry-token", default=os.environ.get("AGENTREACH_TOKEN"),
                        help="a registration token, for direct fallback's registry queries "
                             "(default: $AGENTREACH_TOKEN)")
    parser.add_argument("--session-id", default="demo-session")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    args = parser.parse_args()
    logs.configure(level="warning")
    with SyncReachClient(args.router, api_key=args.api_key, direct_fallback=True, registry_url=args.registry,
                         registry_token=args.registry_token) as client:
        try:
            result = client.call(args.capability, args.payload, context={"session_id": args.session_id},
                                 timeout=args.timeout)
        except ReachError as error:
            print(json.dumps({"error": error.error_code, "can_retry": error.can_retry, "message": str(error)}))
            return 1
        print(json.dumps({"result": result, "route": msgspec.to_builtins(client.last_route)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

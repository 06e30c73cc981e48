"""The mesh as A2A (Agent2Agent, v1.0) agents: an Agent Card per capability and a catalog card on the router,
A2A JSON-RPC calls turned into ATP calls, and A2A agents reached as instances (docs/a2a.md)."""

"""The names of the headers that cross the wire between callers, the router, agents and the registry.

One spelling each, shared by the SDK and the mesh's servers: a header one side writes under a name the
other side does not read is a call that silently loses its id, its trace or its signature.
"""

# The call's id, sent to agents and echoed to callers on every answer.
REQUEST_ID_HEADER = "X-Request-Id"
# The frame's context and the call's remaining time, for rest agents (they see no frame).
CONTEXT_HEADER = "X-Reach-Context"
TIMEOUT_HEADER = "X-Reach-Timeout-Ms"
# Where a rest agent reports a completion that came after the router gave up waiting.
COMPLETION_URL_HEADER = "X-Reach-Completion-Url"
# The router's signature on a forwarded call (agent_reach.signing).
SIGNATURE_HEADER = "X-Reach-Signature"
# Sent by a caller's direct fallback (router unreachable); accepted unsigned only by agents that declared it.
DIRECT_HEADER = "X-Reach-Direct"
# A caller sending this (any value) gets the routing facts as X-Reach-* headers too.
ROUTE_HEADERS = "X-Reach-Route-Headers"
# W3C trace context, continued from the caller through the router to the agent.
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
# A client's API key, a registration token or the admin key (auth.headers reads it; Bearer works too).
API_KEY_HEADER = "X-API-Key"
# Message-queue calls (agent_reach.mq_wire): the stream an answer goes to, and the call's deadline (unix ms).
REPLY_TO_HEADER = "X-Reach-Reply-To"
DEADLINE_HEADER = "X-Reach-Deadline-Ms"
# On an mq answer: the consumer (agent instance) that took the call, and how many times it was delivered.
CONSUMER_HEADER = "X-Reach-Consumer"
DELIVERIES_HEADER = "X-Reach-Deliveries"
# On an mq answer to a call the agent dead-lettered (delivered too many times): the answer is no handler's.
DEAD_LETTERED_HEADER = "X-Reach-Dead-Lettered"

package reach

// The headers between callers, the router, agents and the registry (agent_reach.headers).
const (
	RequestIDHeader     = "X-Request-Id"
	ContextHeader       = "X-Reach-Context"
	TimeoutHeader       = "X-Reach-Timeout-Ms"
	CompletionURLHeader = "X-Reach-Completion-Url"
	SignatureHeader     = "X-Reach-Signature"
	DirectHeader        = "X-Reach-Direct"
	RouteHeaders        = "X-Reach-Route-Headers"
	TraceparentHeader   = "traceparent"
	TracestateHeader    = "tracestate"
	APIKeyHeader        = "X-API-Key"
)

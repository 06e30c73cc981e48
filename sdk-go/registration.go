package reach

// What an agent sends the registry (agent_reach.registration), field for field in the Python SDK's order.

// Capability is one thing an agent can do, as registered. Name is required; zero values take the
// registry's defaults when the agent declares it (version "1.0", SLA 30 s, 1 MiB payloads).
type Capability struct {
	Name            string   `json:"name"`
	Endpoint        string   `json:"endpoint"`
	Version         string   `json:"version"`
	Protocol        string   `json:"protocol"`
	TimeoutSLAMs    int64    `json:"timeout_sla_ms"`
	MaxPayloadBytes int64    `json:"max_payload_bytes"`
	Description     string   `json:"description"`
	Examples        []string `json:"examples"`
	Idempotent      bool     `json:"idempotent"`
	// TrustLevel: "internal", "user_authorized" or "public"; "" leaves it to the router (null).
	TrustLevel            *string  `json:"trust_level"`
	CostPerCall           *float64 `json:"cost_per_call,omitempty"`
	CostPer1kInputTokens  *float64 `json:"cost_per_1k_input_tokens,omitempty"`
	CostPer1kOutputTokens *float64 `json:"cost_per_1k_output_tokens,omitempty"`
}

// RegisterRequest is the body of POST /register.
type RegisterRequest struct {
	AgentID        string         `json:"agent_id"`
	Capabilities   []Capability   `json:"capabilities"`
	Service        *string        `json:"service"`
	BaseURL        *string        `json:"base_url"`
	HealthURL      *string        `json:"health_url"`
	Metadata       map[string]any `json:"metadata"`
	DirectFallback bool           `json:"direct_fallback"`
}

// HeartbeatMetrics are an agent's cumulative counters, in the Python SDK's order.
type HeartbeatMetrics struct {
	Calls          int64 `json:"calls"`
	Errors         int64 `json:"errors"`
	BusinessErrors int64 `json:"business_errors"`
	Timeouts       int64 `json:"timeouts"`
	Tokens         int64 `json:"tokens"`
}

// HeartbeatRequest is the body of POST /heartbeat, sent every 3 s.
type HeartbeatRequest struct {
	AgentID  string            `json:"agent_id"`
	Load     pyFloat           `json:"load"`
	Inflight int64             `json:"inflight"`
	Health   string            `json:"health"`
	Metrics  *HeartbeatMetrics `json:"metrics"`
}

type agentRef struct {
	AgentID string `json:"agent_id"`
}

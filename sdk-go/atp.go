// Package reach is the Go SDK of Agent Reach: a Go agent joins the capability mesh (registration,
// heartbeats, signed calls, drain) and a Go caller reaches a capability through the router.
//
// The wire contract is the Python SDK's (sdk/agent_reach): the same frames, error codes, signatures,
// heartbeat bodies and context rules, checked by the shared vectors in tests/vectors.
package reach

import (
	"encoding/json"
)

// RequestFrame is what a caller sends: a capability and its payload (docs/atp.md "The request frame").
// Field order and omissions follow the Python SDK's msgspec Struct, so both encode the same bytes.
type RequestFrame struct {
	Capability    string          `json:"capability,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	Context       map[string]any  `json:"context,omitempty"`
	RequestID     string          `json:"request_id"`
	TimeoutHint   *int64          `json:"timeout_hint,omitempty"`
	Intent        string          `json:"intent,omitempty"`
	ConfirmIntent bool            `json:"confirm_intent,omitempty"`
	Version       string          `json:"version,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
}

// BusinessError is an answer that is well-formed but useless to the caller. Returned from a handler, it
// is answered as a business error (HTTP 200, counted as a failure by the mesh).
type BusinessError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	Details any    `json:"details,omitempty"`
}

func (b *BusinessError) Error() string {
	if b.Message == "" {
		return b.Code
	}
	return b.Code + ": " + b.Message
}

// IntentCandidate is a capability an intent might mean, with its similarity score.
type IntentCandidate struct {
	Capability string  `json:"capability"`
	Score      float64 `json:"score"`
}

// ScoreParts is an instance's score under the scored policy, part by part.
type ScoreParts struct {
	Latency float64 `json:"latency"`
	Errors  float64 `json:"errors"`
	Load    float64 `json:"load"`
	Cost    float64 `json:"cost"`
	Quality float64 `json:"quality"`
}

// BudgetRoute is what a call's context.budget label did to the pool.
type BudgetRoute struct {
	Label          string   `json:"label"`
	ReferencePrice *float64 `json:"reference_price"`
	Instances      int      `json:"instances"`
	Of             int      `json:"of"`
}

// RouteFacts says how the mesh routed a call ("direct" policy: the SDK's direct fallback).
type RouteFacts struct {
	Instance         string            `json:"instance,omitempty"`
	Policy           string            `json:"policy,omitempty"`
	Attempts         int               `json:"attempts,omitempty"`
	Degraded         bool              `json:"degraded,omitempty"`
	TimeoutSLAMs     *int64            `json:"timeout_sla_ms,omitempty"`
	OverheadMs       *float64          `json:"overhead_ms,omitempty"`
	Capability       string            `json:"capability,omitempty"`
	Reason           string            `json:"reason,omitempty"`
	MatchScore       *float64          `json:"match_score,omitempty"`
	IntentCandidates []IntentCandidate `json:"intent_candidates,omitempty"`
	Rule             string            `json:"rule,omitempty"`
	Version          string            `json:"version,omitempty"`
	Score            *float64          `json:"score,omitempty"`
	ScoreParts       *ScoreParts       `json:"score_parts,omitempty"`
	Explored         bool              `json:"explored,omitempty"`
	Budget           *BudgetRoute      `json:"budget,omitempty"`
}

// Usage is the tokens one call consumed; Cost is the router's, from the serving instance's prices.
type Usage struct {
	InputTokens  int64    `json:"input_tokens"`
	OutputTokens int64    `json:"output_tokens"`
	Cost         *float64 `json:"cost"`
}

// ResponseFrame is what an agent answers when it handled the call.
type ResponseFrame struct {
	RequestID     string          `json:"request_id"`
	Status        string          `json:"status"`
	Result        json.RawMessage `json:"result,omitempty"`
	ContextUpdate map[string]any  `json:"context_update,omitempty"`
	BusinessError *BusinessError  `json:"business_error,omitempty"`
	Route         *RouteFacts     `json:"route,omitempty"`
	Usage         *Usage          `json:"usage,omitempty"`
}

// Decode unmarshals the frame's result into v.
func (r *ResponseFrame) Decode(v any) error {
	if len(r.Result) == 0 {
		return json.Unmarshal([]byte("null"), v)
	}
	return json.Unmarshal(r.Result, v)
}

// ErrorFrame is what the mesh (or an agent) answers when the call did not succeed.
type ErrorFrame struct {
	RequestID     string         `json:"request_id"`
	ErrorCode     ErrorCode      `json:"error_code"`
	ErrorMessage  string         `json:"error_message"`
	CanRetry      bool           `json:"can_retry"`
	BusinessError *BusinessError `json:"business_error,omitempty"`
	Route         *RouteFacts    `json:"route,omitempty"`
	Field         string         `json:"field,omitempty"`
	ResetAt       string         `json:"reset_at,omitempty"`
}

// ChunkFrame is one chunk of a streamed answer, as a caller reads it.
type ChunkFrame struct {
	RequestID string          `json:"request_id"`
	Seq       int             `json:"seq"`
	Data      json.RawMessage `json:"data"`
}

// NewErrorFrame builds an error frame whose can_retry always agrees with the table.
func NewErrorFrame(requestID string, code ErrorCode, message string) *ErrorFrame {
	return &ErrorFrame{RequestID: requestID, ErrorCode: code, ErrorMessage: message, CanRetry: code.CanRetry()}
}

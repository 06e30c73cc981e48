package reach

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxTokens is the largest token count the mesh takes (2^53-1: it sums exactly as a float).
const MaxTokens = 1<<53 - 1

// Call is what a handler knows about the call it serves; the SDK reads it back to answer. Calls a handler
// makes with a Client and the ctx it was given inherit its session, user, trace, remaining token budget and
// deadline, and name it as their parent (agent_reach.context).
type Call struct {
	RequestID  string
	Capability string
	// Payload is the frame's payload as it came; Decode reads it into a value.
	Payload json.RawMessage
	// Context is the frame's context (numbers as json.Number), its trace_id taken from traceparent if absent.
	Context map[string]any
	// Deadline is when the router stops waiting: the frame's timeout_hint, else the capability's SLA.
	Deadline time.Time

	mu             sync.Mutex
	contextUpdate  map[string]any
	usage          *Usage
	tokensReported int64
	tokensSpent    int64
}

// NewCall is the call a handler serves: used by the SDK's dispatcher, and by tests of context rules.
func NewCall(requestID, capability string, callContext map[string]any, deadline time.Time) *Call {
	if callContext == nil {
		callContext = map[string]any{}
	}
	return &Call{RequestID: requestID, Capability: capability, Context: callContext, Deadline: deadline,
		contextUpdate: map[string]any{}}
}

// Decode unmarshals the payload into v.
func (c *Call) Decode(v any) error {
	if len(c.Payload) == 0 {
		return json.Unmarshal([]byte("null"), v)
	}
	return json.Unmarshal(c.Payload, v)
}

func (c *Call) text(name string) string {
	value, _ := c.Context[name].(string)
	return value
}

// SessionID is the context's session_id ("" when absent).
func (c *Call) SessionID() string { return c.text("session_id") }

// UserID is the context's user_id.
func (c *Call) UserID() string { return c.text("user_id") }

// TraceID is the call's trace id.
func (c *Call) TraceID() string { return c.text("trace_id") }

// ParentRequestID is the request id of the call that made this one, when it was nested.
func (c *Call) ParentRequestID() string { return c.text("parent_request_id") }

// Remaining is the time until the caller stops waiting.
func (c *Call) Remaining() time.Duration { return time.Until(c.Deadline) }

// TokenBudget is the budget left for this call: what the caller granted minus what was spent so far
// (no further below 0 than a token count goes); ok is false without a budget.
func (c *Call) TokenBudget() (budget int64, ok bool) {
	granted, ok := wholeNumber(c.Context["token_budget"])
	if !ok {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(granted-c.tokensSpent, -MaxTokens), true
}

// ReportUsage counts tokens this handler consumed: the answer's usage carries them to the router, which
// prices them; heartbeats and the call's token budget see them too.
func (c *Call) ReportUsage(inputTokens, outputTokens int64) error {
	if inputTokens < 0 || inputTokens > MaxTokens || outputTokens < 0 || outputTokens > MaxTokens {
		return fmt.Errorf("token counts are non-negative integers up to %d: got %d, %d", int64(MaxTokens),
			inputTokens, outputTokens)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.usage == nil {
		c.usage = &Usage{}
	}
	c.usage.InputTokens += inputTokens
	c.usage.OutputTokens += outputTokens
	c.tokensReported += inputTokens + outputTokens
	c.tokensSpent += inputTokens + outputTokens
	return nil
}

// ReportTokens counts tokens with no split between prompt and completion, as output tokens.
func (c *Call) ReportTokens(n int64) error { return c.ReportUsage(0, n) }

// SpentByCallee counts tokens a nested call reported: they use up this call's budget but are not this agent's.
func (c *Call) SpentByCallee(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokensSpent += n
}

// UpdateContext sets fields to hand back as the response's context_update (and to pass on to nested calls).
func (c *Call) UpdateContext(fields map[string]any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, value := range fields {
		c.contextUpdate[name] = value
	}
}

// AnswerContextUpdate is the answer's context_update: the handler's fields, with tokens_used once any
// tokens were spent (nil when there is nothing to say).
func (c *Call) AnswerContextUpdate() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.contextUpdate) == 0 && c.tokensSpent == 0 {
		return nil
	}
	update := make(map[string]any, len(c.contextUpdate)+1)
	for name, value := range c.contextUpdate {
		update[name] = value
	}
	if c.tokensSpent != 0 {
		update["tokens_used"] = c.tokensSpent
	}
	return update
}

func (c *Call) answerUsage() (*Usage, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.usage == nil {
		return nil, c.tokensReported
	}
	usage := *c.usage
	return &usage, c.tokensReported
}

// wholeNumber reads a JSON integer (json.Number or a Go integer); floats and other types are not one.
func wholeNumber(value any) (int64, bool) {
	switch number := value.(type) {
	case json.Number:
		if strings.ContainsAny(string(number), ".eE") {
			return 0, false
		}
		parsed, err := strconv.ParseInt(string(number), 10, 64)
		return parsed, err == nil
	case int:
		return int64(number), true
	case int64:
		return number, true
	case int32:
		return int64(number), true
	}
	return 0, false
}

type callKey struct{}
type traceKey struct{}

// WithCall is ctx carrying the call being served: the SDK's dispatcher hands handlers such a ctx.
func WithCall(ctx context.Context, call *Call) context.Context {
	return context.WithValue(ctx, callKey{}, call)
}

// CallFrom is the call being served in ctx, if any.
func CallFrom(ctx context.Context) *Call {
	call, _ := ctx.Value(callKey{}).(*Call)
	return call
}

var (
	traceparentForm = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$`)
	traceIDForm     = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// Traceparent is a W3C trace context (version 00).
type Traceparent struct {
	TraceID string
	SpanID  string
	Flags   string
}

// ParseTraceparent reads a traceparent header; ok is false when it is not one.
func ParseTraceparent(header string) (Traceparent, bool) {
	match := traceparentForm.FindStringSubmatch(header)
	if match == nil {
		return Traceparent{}, false
	}
	return Traceparent{TraceID: match[1], SpanID: match[2], Flags: match[3]}, true
}

func (t Traceparent) String() string { return "00-" + t.TraceID + "-" + t.SpanID + "-" + t.Flags }

// WithTraceparent is ctx continuing the W3C trace of header (an incoming request's traceparent): calls made
// with it join that trace. An invalid header is ignored, never an error.
func WithTraceparent(ctx context.Context, header string) context.Context {
	parent, ok := ParseTraceparent(header)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, parent)
}

// TraceparentFrom is the trace context ctx continues, if any.
func TraceparentFrom(ctx context.Context) (Traceparent, bool) {
	parent, ok := ctx.Value(traceKey{}).(Traceparent)
	return parent, ok
}

// NewRequestID is 32 hex digits laid out as a UUIDv7: Unix milliseconds (48 bits), then 80 random bits.
func NewRequestID() string {
	random := make([]byte, 10)
	_, _ = rand.Read(random)
	return fmt.Sprintf("%012x%s", time.Now().UnixMilli(), hex.EncodeToString(random))
}

// newSpanID is 64 random bits as 16 hex digits, never all zero.
func newSpanID() string {
	random := make([]byte, 8)
	_, _ = rand.Read(random)
	span := binary.BigEndian.Uint64(random)
	if span == 0 {
		span = 1
	}
	return fmt.Sprintf("%016x", span)
}

// IncomingContext is the frame's context, its trace_id taken from the traceparent header when the frame
// has none (agent_reach.context.incoming_context).
func IncomingContext(frameContext map[string]any, traceparent string) map[string]any {
	if frameContext == nil {
		frameContext = map[string]any{}
	}
	if frameContext["trace_id"] != nil {
		return frameContext
	}
	parent, ok := ParseTraceparent(traceparent)
	if !ok {
		return frameContext
	}
	merged := make(map[string]any, len(frameContext)+1)
	for name, value := range frameContext {
		merged[name] = value
	}
	merged["trace_id"] = parent.TraceID
	return merged
}

// OutgoingContext is the context of a call made now with ctx: inherited from the call being served (its
// context, then its context_update, parent_request_id and the token budget left), then explicit; a trace_id
// from ctx's traceparent, else a new one, when none is set (agent_reach.context.outgoing_context).
func OutgoingContext(ctx context.Context, explicit map[string]any) map[string]any {
	outgoing := map[string]any{}
	if call := CallFrom(ctx); call != nil {
		for name, value := range call.Context {
			outgoing[name] = value
		}
		call.mu.Lock()
		for name, value := range call.contextUpdate {
			outgoing[name] = value
		}
		call.mu.Unlock()
		outgoing["parent_request_id"] = call.RequestID
		if budget, ok := call.TokenBudget(); ok {
			outgoing["token_budget"] = budget
		}
	}
	for name, value := range explicit {
		outgoing[name] = value
	}
	if _, set := outgoing["trace_id"]; !set {
		if parent, ok := TraceparentFrom(ctx); ok {
			outgoing["trace_id"] = parent.TraceID
		} else {
			outgoing["trace_id"] = NewRequestID()
		}
	}
	return outgoing
}

// outgoingTraceparent is the traceparent of a call with this context: a fresh span of its trace_id when
// that is a W3C trace id, with ctx's flags when ctx continues that trace ("" otherwise).
func outgoingTraceparent(ctx context.Context, callContext map[string]any) string {
	traceID, _ := callContext["trace_id"].(string)
	if !traceIDForm.MatchString(traceID) {
		return ""
	}
	flags := "01"
	if parent, ok := TraceparentFrom(ctx); ok && parent.TraceID == traceID {
		flags = parent.Flags
	}
	return Traceparent{TraceID: traceID, SpanID: newSpanID(), Flags: flags}.String()
}

package reach

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Serving one ATP frame: exactly one answer per call, whatever the handler does (agent_reach.dispatch).
// Frames that are malformed or too big never reach the handler, nor do calls the guard refuses
// (UNAUTHENTICATED); while the agent stops, or at MaxInflight, new calls are answered BUSY. The handler
// runs under the call's deadline (timeout_hint, else the SLA): past it, TOTAL_TIMEOUT.

// reply is one call's answer: its HTTP status and frame.
type reply struct {
	status int
	body   []byte
}

func errorReply(requestID string, code ErrorCode, message string) reply {
	body, _ := encodeJSON(NewErrorFrame(requestID, code, message))
	return reply{code.HTTPStatus(), body}
}

func writeJSON(w http.ResponseWriter, status int, value any) {
	body, err := encodeJSON(value)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal_error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// lateCompletion is sent to the router's completion URL: the handler succeeded after the caller stopped waiting.
type lateCompletion struct {
	RequestID  string  `json:"request_id"`
	AgentID    string  `json:"agent_id"`
	FinishedMs float64 `json:"finished_ms"`
}

// outcome is how the handler ended.
type outcome struct {
	result any
	err    error
}

func (a *Agent) serveCall(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("capability")
	out := &eventWriter{w: w}
	answer := a.dispatch(r, name, out)
	if out.opened() {
		event := eventAnswer
		if answer.status != http.StatusOK {
			event = eventError
		}
		out.end(EncodeEvent(event, answer.body))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(RequestIDHeader, r.Header.Get(RequestIDHeader))
	w.WriteHeader(answer.status)
	_, _ = w.Write(answer.body)
}

func (a *Agent) dispatch(r *http.Request, name string, out *eventWriter) reply {
	requestID := r.Header.Get(RequestIDHeader)
	served := a.natives[name]
	if served == nil {
		return errorReply(requestID, UnknownCapability, fmt.Sprintf("This agent has no capability '%s'", name))
	}
	limit := served.capability.MaxPayloadBytes
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit+frameEnvelopeBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errorReply(requestID, PayloadTooLarge, fmt.Sprintf("Payload over %d bytes", limit))
	}
	if err != nil {
		return errorReply(requestID, InvalidFrame, "The request body could not be read: "+err.Error())
	}
	if refused := a.guard.refusal(name, r.Method, r.Header, body); refused != "" {
		return errorReply(requestID, Unauthenticated, refused)
	}
	var frame RequestFrame
	if err := decodePeer(body, &frame); err != nil {
		return errorReply(requestID, InvalidFrame, "Not a request frame: "+err.Error())
	}
	if frame.RequestID == "" {
		frame.RequestID = NewRequestID()
	}
	if frame.Capability != "" && frame.Capability != name {
		return errorReply(frame.RequestID, InvalidFrame,
			fmt.Sprintf("Frame names capability '%s' but was sent to '%s'", frame.Capability, name))
	}
	if int64(len(body)) > limit && int64(len(frame.Payload)) > limit {
		return errorReply(frame.RequestID, PayloadTooLarge, fmt.Sprintf("Payload over %d bytes", limit))
	}
	if why := a.inflight.enter(); why != "" {
		if why == "full" {
			why = fmt.Sprintf("at its limit of %d calls", a.config.MaxInflight)
		}
		return errorReply(frame.RequestID, Busy, fmt.Sprintf("Agent %s is %s", a.config.AgentID, why))
	}
	defer a.inflight.leave()
	if !(frame.Stream && served.stream != nil) {
		out = nil
	}
	return a.run(r, served, &frame, out)
}

func (a *Agent) run(r *http.Request, served *native, frame *RequestFrame, out *eventWriter) reply {
	budget := time.Duration(served.capability.TimeoutSLAMs) * time.Millisecond
	if frame.TimeoutHint != nil {
		budget = time.Duration(*frame.TimeoutHint) * time.Millisecond
	}
	started := time.Now()
	deadline := started.Add(budget)
	call := NewCall(frame.RequestID, served.capability.Name,
		IncomingContext(frame.Context, r.Header.Get(TraceparentHeader)), deadline)
	call.Payload = frame.Payload
	// A caller that leaves a streamed call cancels it; any other call runs on, so a late result can still
	// be reported to the router.
	parent := r.Context()
	if out == nil {
		parent = context.WithoutCancel(parent)
	}
	ctx, cancel := context.WithDeadline(WithTraceparent(WithCall(parent, call), r.Header.Get(TraceparentHeader)),
		deadline)
	defer cancel()
	stopAbandon := context.AfterFunc(a.abandon, cancel)
	defer stopAbandon()
	done := make(chan outcome, 1)
	go func() { done <- a.invoke(ctx, served, call, out) }()
	completionURL := r.Header.Get(CompletionURLHeader)
	var ended outcome
	select {
	case ended = <-done:
	case <-ctx.Done():
	}
	if ctx.Err() != nil && (ended.err == nil && ended.result == nil || errors.Is(ended.err, ctx.Err())) {
		return a.interrupted(r, call, out != nil, budget)
	}
	answer, result := a.answer(ended, call)
	a.inflight.outcome(result, tokensOf(call))
	if completionURL != "" && answer.status == http.StatusOK &&
		(time.Now().After(deadline) || r.Context().Err() != nil) {
		a.reportLate(completionURL, call.RequestID, started)
	}
	return answer
}

// interrupted is the answer to a call whose handler did not finish: abandoned by a drain past its
// deadline, left by its streaming caller (not the agent's failure: not counted as one), or overrun.
func (a *Agent) interrupted(r *http.Request, call *Call, streamed bool, budget time.Duration) reply {
	if a.abandon.Err() != nil {
		a.inflight.outcome("error", tokensOf(call))
		return errorReply(call.RequestID, Busy, "Agent stopped before the call finished")
	}
	if streamed && r.Context().Err() != nil {
		a.log.Info("caller left a streamed call; handler cancelled", "request_id", call.RequestID)
		return errorReply(call.RequestID, Busy, "The caller left before the call finished")
	}
	a.inflight.outcome("timeout", tokensOf(call))
	a.log.Warn("handler overran its deadline; cancelled", "request_id", call.RequestID,
		"budget_ms", budget.Milliseconds())
	return errorReply(call.RequestID, TotalTimeout,
		fmt.Sprintf("Handler did not finish within %d ms", budget.Milliseconds()))
}

func tokensOf(call *Call) int64 {
	_, reported := call.answerUsage()
	return reported
}

// invoke runs the handler, a panic being its failure.
func (a *Agent) invoke(ctx context.Context, served *native, call *Call, out *eventWriter) (ended outcome) {
	defer func() {
		if panicked := recover(); panicked != nil {
			a.log.Error("handler panicked", "request_id", call.RequestID, "panic", fmt.Sprint(panicked))
			ended = outcome{err: fmt.Errorf("panic: %v", panicked)}
		}
	}()
	if served.handler != nil {
		result, err := served.handler(ctx, call)
		return outcome{result, err}
	}
	var last any
	seq := 0
	send := func(chunk any) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = chunk
		if out == nil {
			return nil
		}
		data, err := encodeJSON(chunk)
		if err != nil {
			return fmt.Errorf("chunk is not JSON: %w", err)
		}
		event, _ := encodeJSON(ChunkFrame{RequestID: call.RequestID, Seq: seq, Data: data})
		seq++
		return out.send(EncodeEvent(eventChunk, event))
	}
	result, err := served.stream(ctx, call, send)
	if result == nil && err == nil {
		result = last
	}
	return outcome{result, err}
}

// answer is the reply for how the handler ended, and the outcome to count.
func (a *Agent) answer(ended outcome, call *Call) (reply, string) {
	update := call.AnswerContextUpdate()
	var business *BusinessError
	if errors.As(ended.err, &business) {
		frame := ResponseFrame{RequestID: call.RequestID, Status: "error", BusinessError: business,
			ContextUpdate: update}
		return encodedReply(frame, call.RequestID, "business_error")
	}
	var code ErrorCode
	if errors.As(ended.err, &code) && code.Known() {
		// A handler refusing the call with an ATP code (reach.InvalidPayload, say): answered as that code.
		return errorReply(call.RequestID, code, ended.err.Error()), "error"
	}
	if ended.err != nil {
		a.log.Error("handler failed", "request_id", call.RequestID, "error", ended.err.Error())
		return errorReply(call.RequestID, AgentError, fmt.Sprintf("%T: %v", ended.err, ended.err)), "error"
	}
	usage, _ := call.answerUsage()
	frame := ResponseFrame{RequestID: call.RequestID, Status: "success", ContextUpdate: update, Usage: usage}
	if ended.result != nil {
		result, err := encodeJSON(ended.result)
		if err != nil {
			a.log.Error("handler answered something that is not JSON", "error", err.Error())
			return errorReply(call.RequestID, AgentError, "Answer is not JSON-encodable: "+err.Error()), "error"
		}
		frame.Result = result
	}
	return encodedReply(frame, call.RequestID, "ok")
}

func encodedReply(frame ResponseFrame, requestID, result string) (reply, string) {
	body, err := encodeJSON(frame)
	if err != nil {
		return errorReply(requestID, AgentError, "Answer is not JSON-encodable: "+err.Error()), "error"
	}
	return reply{http.StatusOK, body}, result
}

// reportLate tells the router's completion URL about a result it stopped waiting for.
func (a *Agent) reportLate(url, requestID string, started time.Time) {
	a.log.Warn("handler finished after its deadline; telling the router", "completion_url", url)
	notice, _ := encodeJSON(lateCompletion{RequestID: requestID, AgentID: a.config.AgentID,
		FinishedMs: float64(time.Since(started).Microseconds()) / 1000})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		request, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(notice))
		if err != nil {
			return
		}
		request.Header.Set("Content-Type", "application/json")
		response, err := a.http.Do(request)
		if err != nil {
			a.log.Warn("could not send the late-completion notice", "error", err.Error())
			return
		}
		_ = response.Body.Close()
	}()
}

// eventWriter is a streamed answer opened only with its first event, so the answer's status can still be
// an error's when nothing was streamed. Chunks and the final event are written under one lock, and none
// after the final one.
type eventWriter struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	open   bool
	closed bool
}

var errStreamClosed = errors.New("the stream is closed: the call has ended")

func (e *eventWriter) opened() bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.open
}

func (e *eventWriter) writeLocked(event []byte) error {
	if !e.open {
		header := e.w.Header()
		header.Set("Content-Type", EventStream)
		header.Set("Cache-Control", "no-cache")
		header.Set("X-Accel-Buffering", "no")
		e.w.WriteHeader(http.StatusOK)
		e.open = true
	}
	if _, err := e.w.Write(event); err != nil {
		return err
	}
	return http.NewResponseController(e.w).Flush()
}

func (e *eventWriter) send(event []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errStreamClosed
	}
	return e.writeLocked(event)
}

func (e *eventWriter) end(event []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	_ = e.writeLocked(event)
}

package reach

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Moving one request frame over HTTP and turning whatever comes back into a frame (agent_reach.transport).
// Callers always get a response or an error frame back; only a request that was never sent fails with
// errUnreachable (trying elsewhere is then always safe), and one that got no answer in time with errSilent.

// Answer is a call's final frame: a response frame or an error frame.
type Answer struct {
	Response *ResponseFrame
	Error    *ErrorFrame
	// RetryAfter is the router's Retry-After header (BUSY, BUDGET_EXHAUSTED), 0 when absent.
	RetryAfter time.Duration
}

// Route is how the mesh routed the call.
func (a *Answer) Route() *RouteFacts {
	if a.Error != nil {
		return a.Error.Route
	}
	return a.Response.Route
}

func errorAnswer(requestID string, code ErrorCode, message string) *Answer {
	return &Answer{Error: NewErrorFrame(requestID, code, message)}
}

var (
	errUnreachable = errors.New("unreachable: nothing was sent")
	errSilent      = errors.New("no answer in time")
)

// statusCodes reads an HTTP status that came without a frame.
var statusCodes = map[int]ErrorCode{400: InvalidFrame, 413: PayloadTooLarge, 429: Busy, 504: TotalTimeout}

func statusMessage(status int, body []byte) string {
	if len(body) > 200 {
		body = body[:200]
	}
	return fmt.Sprintf("HTTP %d: %s", status, bytes.ToValidUTF8(body, []byte("\uFFFD")))
}

// StatusError is the error frame for an HTTP answer that carried no frame of its own.
func StatusError(requestID string, status int, body []byte) *ErrorFrame {
	code, ok := statusCodes[status]
	if !ok {
		code = AgentError
	}
	return NewErrorFrame(requestID, code, statusMessage(status, body))
}

// DecodeATP reads an ATP answer: a response frame with HTTP 200, else an error frame; a body that is neither
// stands for its status (agent_reach.transport.decode_atp).
func DecodeATP(requestID string, status int, body []byte) *Answer {
	if status == http.StatusOK {
		var frame ResponseFrame
		if decodeFrame(body, &frame) == nil && frame.RequestID != "" && validStatus(frame.Status) {
			return &Answer{Response: &frame}
		}
	} else {
		var frame ErrorFrame
		if decodeFrame(body, &frame) == nil && frame.RequestID != "" && frame.ErrorCode.Known() {
			return &Answer{Error: &frame}
		}
	}
	return &Answer{Error: StatusError(requestID, status, body)}
}

func validStatus(status string) bool {
	return status == "success" || status == "error" || status == "busy"
}

// decodeFrame decodes a frame a peer sent, its required members present.
func decodeFrame(body []byte, frame any) error {
	var members map[string]json.RawMessage
	if err := decodePeer(body, &members); err != nil {
		return err
	}
	switch frame.(type) {
	case *ResponseFrame:
		if members["request_id"] == nil || members["status"] == nil {
			return errors.New("a response frame needs request_id and status")
		}
	case *ErrorFrame:
		for _, name := range []string{"request_id", "error_code", "error_message", "can_retry"} {
			if members[name] == nil {
				return fmt.Errorf("an error frame needs %s", name)
			}
		}
	}
	return decodePeer(body, frame)
}

// DecodeREST reads a REST agent's answer as the router does: its JSON is the result; a top-level
// business_error is a failure (agent_reach.transport.decode_rest).
func DecodeREST(requestID string, status int, body []byte) *Answer {
	if status < 200 || status >= 300 {
		return errorAnswer(requestID, AgentStatusCode(status), statusMessage(status, body))
	}
	if len(body) == 0 {
		return &Answer{Response: &ResponseFrame{RequestID: requestID, Status: "success"}}
	}
	var result any
	if err := decodePeer(body, &result); err != nil {
		return errorAnswer(requestID, AgentError, "answer is not usable JSON: "+err.Error())
	}
	object, _ := result.(map[string]any)
	raw, present := object["business_error"]
	if !present || raw == nil {
		return &Answer{Response: &ResponseFrame{RequestID: requestID, Status: "success", Result: body}}
	}
	business := AgentBusinessError(raw)
	if business == nil {
		return errorAnswer(requestID, AgentError, "answer is not usable: "+businessErrorShape)
	}
	return &Answer{Response: &ResponseFrame{RequestID: requestID, Status: "error", BusinessError: business}}
}

const businessErrorShape = "business_error must be a code (a string or a number) or an object with such a code"

// AgentStatusCode is what an agent's HTTP status outside 2xx means when its body is no frame.
func AgentStatusCode(status int) ErrorCode {
	switch status {
	case 429:
		return Busy
	case 400, 422:
		return InvalidPayload
	case 413:
		return PayloadTooLarge
	case 414, 431:
		return InvalidFrame
	}
	return AgentError
}

// AgentBusinessError reads an agent's business_error (decoded with json.Number): a code, or an object with a
// code (a number kept as its JSON text) and optional message and details; nil when it is neither.
func AgentBusinessError(raw any) *BusinessError {
	if code, ok := codeText(raw); ok {
		return &BusinessError{Code: code}
	}
	object, ok := raw.(map[string]any)
	if !ok {
		return nil
	}
	code, ok := codeText(object["code"])
	if !ok {
		return nil
	}
	message, isText := object["message"].(string)
	if object["message"] != nil && !isText {
		return nil
	}
	return &BusinessError{Code: code, Message: message, Details: object["details"]}
}

func codeText(raw any) (string, bool) {
	switch code := raw.(type) {
	case string:
		return code, true
	case json.Number:
		return pythonNumberText(code), true
	}
	return "", false
}

// pythonNumberText is a JSON number as msgspec re-encodes it (an integer as is, a float in its shortest form).
func pythonNumberText(number json.Number) string {
	if _, err := strconv.ParseInt(string(number), 10, 64); err == nil {
		return string(number)
	}
	value, err := number.Float64()
	if err != nil {
		return string(number)
	}
	text, _ := pyFloat(value).MarshalJSON()
	return string(text)
}

// nothingSent says whether err means the request never left: the connection could not be opened.
func nothingSent(err error) bool {
	var opError *net.OpError
	return errors.As(err, &opError) && opError.Op == "dial"
}

func retryAfter(header http.Header) time.Duration {
	seconds, err := strconv.Atoi(header.Get("Retry-After"))
	if err != nil || seconds < 0 {
		return 0
	}
	return time.Duration(seconds) * time.Second
}

// post sends body to url and reads the answer with decode; errUnreachable when nothing was sent, errSilent
// when nothing came back before ctx's deadline, ctx's own error when the caller cancelled.
func post(ctx context.Context, client *http.Client, url string, body []byte, headers http.Header,
	decode func(requestID string, status int, body []byte) *Answer, requestID string) (*Answer, error) {
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	request.Header = headers
	response, err := client.Do(request)
	if err != nil {
		return brokenExchange(ctx, url, err, requestID)
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(response.Body)
	if err != nil {
		return brokenExchange(ctx, url, err, requestID)
	}
	decoded := decode(requestID, response.StatusCode, answer)
	decoded.RetryAfter = retryAfter(response.Header)
	return decoded, nil
}

// brokenExchange is a failed exchange's outcome: an error when nothing was sent, nothing came back in time or
// the caller cancelled; else an AGENT_ERROR answer (the peer may have run the call).
func brokenExchange(ctx context.Context, url string, err error, requestID string) (*Answer, error) {
	failure := transportFailure(ctx, url, err)
	if errors.Is(failure, errUnreachable) || errors.Is(failure, errSilent) || ctx.Err() != nil {
		return nil, failure
	}
	return errorAnswer(requestID, AgentError, failure.Error()), nil
}

// transportFailure sorts a failed exchange: nothing sent, no answer in time, or the caller's cancellation.
func transportFailure(ctx context.Context, url string, err error) error {
	switch {
	case nothingSent(err):
		return fmt.Errorf("%w: %s: %v", errUnreachable, url, err)
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Errorf("%w: no answer from %s in time", errSilent, url)
	}
	return fmt.Errorf("connection to %s failed: %w", url, err)
}

func isTimeout(err error) bool {
	var timeout interface{ Timeout() bool }
	return errors.As(err, &timeout) && timeout.Timeout()
}

func isEventStream(header http.Header) bool {
	media, _, err := mime.ParseMediaType(header.Get("Content-Type"))
	return err == nil && media == EventStream
}

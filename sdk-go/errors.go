package reach

import (
	"fmt"
	"time"
)

// ErrorCode is one ATP error code. It is an error itself, so a call's failure can be matched with
// errors.Is(err, reach.Busy) whatever the code.
type ErrorCode string

// Every error the mesh can answer (agent_reach.atp.ErrorCode; docs/atp.md "Error codes").
const (
	InvalidFrame             ErrorCode = "INVALID_FRAME"
	PayloadTooLarge          ErrorCode = "PAYLOAD_TOO_LARGE"
	InvalidPayload           ErrorCode = "INVALID_PAYLOAD"
	UnknownCapability        ErrorCode = "UNKNOWN_CAPABILITY"
	NoRoutableInstance       ErrorCode = "NO_ROUTABLE_INSTANCE"
	RoutingHintUnsatisfiable ErrorCode = "ROUTING_HINT_UNSATISFIABLE"
	ConnectTimeout           ErrorCode = "CONNECT_TIMEOUT"
	FirstByteTimeout         ErrorCode = "FIRST_BYTE_TIMEOUT"
	TotalTimeout             ErrorCode = "TOTAL_TIMEOUT"
	IdleTimeout              ErrorCode = "IDLE_TIMEOUT"
	CircuitOpen              ErrorCode = "CIRCUIT_OPEN"
	Busy                     ErrorCode = "BUSY"
	AgentError               ErrorCode = "AGENT_ERROR"
	AnswerTooLarge           ErrorCode = "ANSWER_TOO_LARGE"
	BusinessErrorCode        ErrorCode = "BUSINESS_ERROR"
	Unauthenticated          ErrorCode = "UNAUTHENTICATED"
	Forbidden                ErrorCode = "FORBIDDEN"
	TrustLevelInsufficient   ErrorCode = "TRUST_LEVEL_INSUFFICIENT"
	IntentAmbiguous          ErrorCode = "INTENT_AMBIGUOUS"
	IntentUnmatched          ErrorCode = "INTENT_UNMATCHED"
	VersionUnsatisfiable     ErrorCode = "VERSION_UNSATISFIABLE"
	InternalError            ErrorCode = "INTERNAL_ERROR"
	BudgetExhausted          ErrorCode = "BUDGET_EXHAUSTED"
)

type codeFacts struct {
	status   int
	canRetry bool
}

// The HTTP status of each code and whether a retry may help: the table of agent_reach.atp, checked
// against it by tests/vectors/error_codes.json.
var errorTable = map[ErrorCode]codeFacts{
	InvalidFrame:             {400, false},
	PayloadTooLarge:          {413, false},
	InvalidPayload:           {400, false},
	UnknownCapability:        {404, false},
	NoRoutableInstance:       {503, true},
	RoutingHintUnsatisfiable: {503, false},
	ConnectTimeout:           {504, true},
	FirstByteTimeout:         {504, true},
	TotalTimeout:             {504, true},
	IdleTimeout:              {504, true},
	CircuitOpen:              {503, true},
	Busy:                     {429, true},
	AgentError:               {502, true},
	AnswerTooLarge:           {502, false},
	BusinessErrorCode:        {422, false},
	Unauthenticated:          {401, false},
	Forbidden:                {403, false},
	TrustLevelInsufficient:   {403, false},
	IntentAmbiguous:          {422, false},
	IntentUnmatched:          {422, false},
	VersionUnsatisfiable:     {503, false},
	InternalError:            {500, true},
	BudgetExhausted:          {429, true},
}

// ErrorCodes lists every code of the table.
func ErrorCodes() []ErrorCode {
	codes := make([]ErrorCode, 0, len(errorTable))
	for code := range errorTable {
		codes = append(codes, code)
	}
	return codes
}

func (c ErrorCode) Error() string { return string(c) }

// HTTPStatus is the status the mesh answers this code with (502 for a code outside the table).
func (c ErrorCode) HTTPStatus() int {
	if facts, ok := errorTable[c]; ok {
		return facts.status
	}
	return 502
}

// CanRetry says whether the same call may succeed later.
func (c ErrorCode) CanRetry() bool { return errorTable[c].canRetry }

// Known says whether the code is one of the table.
func (c ErrorCode) Known() bool {
	_, ok := errorTable[c]
	return ok
}

// Error is a call that did not succeed: an error frame, a business error or a busy answer.
// errors.Is(err, reach.BudgetExhausted) matches its code; RetryAfter is the router's Retry-After.
type Error struct {
	Code       ErrorCode
	Message    string
	CanRetry   bool
	RetryAfter time.Duration
	// Frame is the error frame answered (nil for a business error or a busy status in a response frame).
	Frame *ErrorFrame
	// Response is the response frame, for a business error answered as one (a direct call's).
	Response *ResponseFrame
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Is matches an ErrorCode: errors.Is(err, reach.Busy).
func (e *Error) Is(target error) bool {
	code, ok := target.(ErrorCode)
	return ok && code == e.Code
}

// Business is the agent's business error, if the call failed with one.
func (e *Error) Business() *BusinessError {
	if e.Frame != nil && e.Frame.BusinessError != nil {
		return e.Frame.BusinessError
	}
	if e.Response != nil {
		return e.Response.BusinessError
	}
	return nil
}

// Route is how the mesh routed the failed call, when routing started.
func (e *Error) Route() *RouteFacts {
	if e.Frame != nil {
		return e.Frame.Route
	}
	if e.Response != nil {
		return e.Response.Route
	}
	return nil
}

// failure is the error an answer stands for, nil for a success (agent_reach.client.ReachError).
func failure(answer *Answer) error {
	if answer.Error != nil {
		frame := answer.Error
		return &Error{Code: frame.ErrorCode, Message: frame.ErrorMessage, CanRetry: frame.CanRetry,
			RetryAfter: answer.RetryAfter, Frame: frame}
	}
	response := answer.Response
	if response.Status == "success" {
		return nil
	}
	if response.BusinessError != nil {
		return &Error{Code: BusinessErrorCode, Message: response.BusinessError.Error(), Response: response}
	}
	return &Error{Code: Busy, Message: "status " + response.Status, CanRetry: true, RetryAfter: answer.RetryAfter,
		Response: response}
}

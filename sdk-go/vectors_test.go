package reach

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The shared vectors (tests/vectors/*.json): the contract between the Python SDK, which wrote them, and this
// one. Each file is read strictly: a section or member this file does not know fails the test, so none is
// skipped without a word.

const vectorsDir = "../tests/vectors"

// loadVectors decodes tests/vectors/<name>.json into v: numbers as json.Number (as frames reach the SDK),
// unknown members refused.
func loadVectors(t testing.TB, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(vectorsDir, name+".json"))
	if err != nil {
		t.Fatalf("the shared vectors: %v", err)
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(v); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	// A section left empty would check nothing.
	sections := reflect.ValueOf(v).Elem()
	for i := range sections.NumField() {
		if field := sections.Field(i); field.Kind() == reflect.Slice && field.Len() == 0 {
			t.Fatalf("%s.json: section %s is missing or empty", name, sections.Type().Field(i).Tag.Get("json"))
		}
	}
}

// sameJSON fails unless got and want are the same JSON value (members in any order, numbers as written).
func sameJSON(t *testing.T, what string, got []byte, want any) {
	t.Helper()
	wanted, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(jsonValue(t, got), jsonValue(t, wanted)) {
		t.Fatalf("%s:\n got  %s\n want %s", what, got, wanted)
	}
}

func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	var value any
	if err := decoder.Decode(&value); err != nil {
		t.Fatalf("%s is not JSON: %v", data, err)
	}
	return value
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	encoded, err := encodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return encoded
}

// caseName is a short readable subtest name out of a vector's text.
func caseName(index int, text string) string {
	if len(text) > 40 {
		text = text[:40]
	}
	return fmt.Sprintf("%02d %s", index, text)
}

// --- frames.json ---------------------------------------------------------------------------------------

type answerVector struct {
	Status    int             `json:"status"`
	Body      string          `json:"body"`
	RequestID string          `json:"request_id"`
	Expected  json.RawMessage `json:"expected"`
}

type chunkVector struct {
	RequestID string `json:"request_id"`
	Seq       int    `json:"seq"`
	Data      string `json:"data"`
	Event     string `json:"event"`
}

type eventVector struct {
	Name string `json:"name"`
	Data string `json:"data"`
}

type streamVector struct {
	Pieces []string      `json:"pieces"`
	Events []eventVector `json:"events"`
}

type frameVectors struct {
	About        string         `json:"about"`
	Requests     []string       `json:"requests"`
	Responses    []string       `json:"responses"`
	Errors       []string       `json:"errors"`
	ATPAnswers   []answerVector `json:"atp_answers"`
	RESTAnswers  []answerVector `json:"rest_answers"`
	ChunkEvents  []chunkVector  `json:"chunk_events"`
	EventStreams []streamVector `json:"event_streams"`
}

func frames(t *testing.T) frameVectors {
	var vectors frameVectors
	loadVectors(t, "frames", &vectors)
	return vectors
}

// A request frame as an agent decodes it and a caller encodes it: the Python bytes, round trip.
func TestVectorRequestFramesRoundTrip(t *testing.T) {
	for i, encoded := range frames(t).Requests {
		t.Run(caseName(i, encoded), func(t *testing.T) {
			var frame RequestFrame
			if err := decodePeer([]byte(encoded), &frame); err != nil {
				t.Fatal(err)
			}
			if got := mustEncode(t, &frame); string(got) != encoded {
				t.Fatalf("re-encoded\n got  %s\n want %s", got, encoded)
			}
		})
	}
}

// A response frame as a caller reads it (DecodeATP, HTTP 200) and an agent writes it.
func TestVectorResponseFramesRoundTrip(t *testing.T) {
	for i, encoded := range frames(t).Responses {
		t.Run(caseName(i, encoded), func(t *testing.T) {
			answer := DecodeATP("unused", http.StatusOK, []byte(encoded))
			if answer.Response == nil {
				t.Fatalf("not read as a response frame: %+v", answer.Error)
			}
			if got := mustEncode(t, answer.Response); string(got) != encoded {
				t.Fatalf("re-encoded\n got  %s\n want %s", got, encoded)
			}
		})
	}
}

// An error frame as a caller reads it (with its code's HTTP status) and an agent writes it.
func TestVectorErrorFramesRoundTrip(t *testing.T) {
	for i, encoded := range frames(t).Errors {
		t.Run(caseName(i, encoded), func(t *testing.T) {
			var code struct {
				ErrorCode ErrorCode `json:"error_code"`
			}
			if err := json.Unmarshal([]byte(encoded), &code); err != nil {
				t.Fatal(err)
			}
			answer := DecodeATP("unused", code.ErrorCode.HTTPStatus(), []byte(encoded))
			if answer.Error == nil || answer.Error.ErrorMessage == "" {
				t.Fatalf("not read as an error frame: %+v", answer)
			}
			if got := mustEncode(t, answer.Error); string(got) != encoded {
				t.Fatalf("re-encoded\n got  %s\n want %s", got, encoded)
			}
		})
	}
}

// checkAnswer compares an answer with the frame the Python SDK made of the same HTTP answer.
func checkAnswer(t *testing.T, answer *Answer, expected json.RawMessage) {
	t.Helper()
	var want map[string]any
	if err := decodePeer(expected, &want); err != nil {
		t.Fatal(err)
	}
	_, wantsResponse := want["status"]
	switch {
	case wantsResponse && answer.Response == nil:
		t.Fatalf("a response frame expected, got the error %+v", answer.Error)
	case !wantsResponse && answer.Error == nil:
		t.Fatalf("an error frame expected, got the response %+v", answer.Response)
	case wantsResponse:
		sameJSON(t, "response frame", mustEncode(t, answer.Response), want)
		return
	}
	if message := want["error_message"].(string); strings.HasPrefix(message, parserMessagePrefix) {
		// The rest of such a message is the JSON parser's own diagnostic (msgspec's, Go's): the code, the
		// retry and the prefix are the contract, not the parser's wording.
		if !strings.HasPrefix(answer.Error.ErrorMessage, parserMessagePrefix) ||
			len(answer.Error.ErrorMessage) == len(parserMessagePrefix) {
			t.Fatalf("error_message %q: expected %q and the parser's diagnostic", answer.Error.ErrorMessage,
				parserMessagePrefix)
		}
		want["error_message"] = answer.Error.ErrorMessage
	}
	sameJSON(t, "error frame", mustEncode(t, answer.Error), want)
}

const parserMessagePrefix = "answer is not usable JSON: "

// What a caller makes of an ATP answer (an agent's or the router's): the frame, else its HTTP status.
func TestVectorATPAnswers(t *testing.T) {
	for i, vector := range frames(t).ATPAnswers {
		t.Run(caseName(i, fmt.Sprintf("HTTP %d %s", vector.Status, vector.Body)), func(t *testing.T) {
			checkAnswer(t, DecodeATP(vector.RequestID, vector.Status, []byte(vector.Body)), vector.Expected)
		})
	}
}

// What the direct fallback makes of a REST agent's answer, as the router reads one.
func TestVectorRESTAnswers(t *testing.T) {
	for i, vector := range frames(t).RESTAnswers {
		t.Run(caseName(i, fmt.Sprintf("HTTP %d %s", vector.Status, vector.Body)), func(t *testing.T) {
			checkAnswer(t, DecodeREST(vector.RequestID, vector.Status, []byte(vector.Body)), vector.Expected)
		})
	}
}

// A chunk event as a Go agent streams it (byte for byte, from a real server on loopback) and as a Go
// caller reads it back.
func TestVectorChunkEvents(t *testing.T) {
	agent, err := NewAgent(AgentConfig{AgentID: "vectors-1", RegistryURLs: []string{"http://127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	// The handler streams seq placeholder chunks, then the vector's data: the (seq+1)th event is the vector's.
	err = agent.StreamCapability(Capability{Name: "vectors.chunks"},
		func(ctx context.Context, call *Call, send func(any) error) (any, error) {
			var asked struct {
				Seq  int             `json:"seq"`
				Data json.RawMessage `json:"data"`
			}
			if err := call.Decode(&asked); err != nil {
				return nil, err
			}
			for range asked.Seq {
				if err := send(0); err != nil {
					return nil, err
				}
			}
			return nil, send(asked.Data)
		})
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewServer(agent.Handler())
	defer server.Close()
	for i, vector := range frames(t).ChunkEvents {
		t.Run(caseName(i, vector.Event), func(t *testing.T) {
			payload := fmt.Sprintf(`{"seq":%d,"data":%s}`, vector.Seq, vector.Data)
			frame := fmt.Sprintf(`{"capability":"vectors.chunks","payload":%s,"request_id":%q,"stream":true}`,
				payload, vector.RequestID)
			request, _ := http.NewRequest(http.MethodPost, server.URL+"/atp/vectors.chunks", strings.NewReader(frame))
			request.Header.Set("Accept", EventStream)
			response, err := server.Client().Do(request)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(response.Body)
			_ = response.Body.Close()
			if err != nil || !isEventStream(response.Header) {
				t.Fatalf("not a stream (%v): %s %s", err, response.Header.Get("Content-Type"), body)
			}
			events := strings.SplitAfter(string(body), "\n\n")
			if len(events) <= vector.Seq || events[vector.Seq] != vector.Event {
				t.Fatalf("event %d of\n%s\nwant %q", vector.Seq, body, vector.Event)
			}

			var parser EventParser
			read := parser.Feed([]byte(vector.Event))
			if len(read) != 1 || read[0].Name != eventChunk {
				t.Fatalf("parsed %+v", read)
			}
			var chunk ChunkFrame
			if err := decodePeer(read[0].Data, &chunk); err != nil {
				t.Fatal(err)
			}
			if chunk.RequestID != vector.RequestID || chunk.Seq != vector.Seq || string(chunk.Data) != vector.Data {
				t.Fatalf("read back %+v (data %s)", chunk, chunk.Data)
			}
		})
	}
}

// Events out of a byte stream cut anywhere, with every line end the SSE standard allows.
func TestVectorEventStreams(t *testing.T) {
	for i, vector := range frames(t).EventStreams {
		t.Run(caseName(i, strings.Join(vector.Pieces, "|")), func(t *testing.T) {
			var parser EventParser
			got := []eventVector{}
			for _, piece := range vector.Pieces {
				for _, event := range parser.Feed([]byte(piece)) {
					got = append(got, eventVector{Name: event.Name, Data: string(event.Data)})
				}
			}
			if !reflect.DeepEqual(got, vector.Events) {
				t.Fatalf("events %q, want %q", got, vector.Events)
			}
		})
	}
}

// --- signatures.json -----------------------------------------------------------------------------------

type keyVector struct {
	Token string `json:"token"`
	Key   string `json:"key"`
}

// signedRequest is what a signature covers, at a time.
type signedRequest struct {
	Header    string `json:"header"`
	Key       string `json:"key"`
	AgentID   string `json:"agent_id"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	RequestID string `json:"request_id"`
	Body      string `json:"body"`
	Now       int64  `json:"now"`
}

type signatureVector struct {
	signedRequest
	Nonce string `json:"nonce"`
}

type verificationVector struct {
	signedRequest
	Name    string  `json:"name"`
	WindowS float64 `json:"window_s"`
	Reason  *string `json:"reason"`
}

type signatureVectors struct {
	About         string               `json:"about"`
	Keys          []keyVector          `json:"keys"`
	Signatures    []signatureVector    `json:"signatures"`
	Verifications []verificationVector `json:"verifications"`
}

func signatures(t *testing.T) signatureVectors {
	var vectors signatureVectors
	loadVectors(t, "signatures", &vectors)
	return vectors
}

// The key an agent derives from its registration token is the one the router signs with.
func TestVectorSigningKeys(t *testing.T) {
	for i, vector := range signatures(t).Keys {
		t.Run(caseName(i, vector.Token), func(t *testing.T) {
			if got := SigningKey(vector.Token); got != vector.Key {
				t.Fatalf("key %s, want %s", got, vector.Key)
			}
		})
	}
}

// A v2 signature at a fixed time and nonce is the router's, and the Go verifier accepts it.
func TestVectorSignatures(t *testing.T) {
	for i, vector := range signatures(t).Signatures {
		t.Run(caseName(i, vector.AgentID+" "+vector.Path), func(t *testing.T) {
			now := time.Unix(vector.Now, 0)
			got := Sign(vector.Key, vector.AgentID, vector.Method, vector.Path, vector.RequestID, []byte(vector.Body),
				now, vector.Nonce)
			if got != vector.Header {
				t.Fatalf("header %s, want %s", got, vector.Header)
			}
			if _, reason := VerifySignature(got, vector.Key, vector.AgentID, vector.Method, vector.Path,
				vector.RequestID, []byte(vector.Body), now, DefaultSignatureWindow); reason != "" {
				t.Fatalf("own signature refused: %s", reason)
			}
		})
	}
}

// Verification accepts exactly what the Python SDK accepts, and refuses the rest for the same reason.
func TestVectorVerifications(t *testing.T) {
	for _, vector := range signatures(t).Verifications {
		t.Run(vector.Name, func(t *testing.T) {
			window := time.Duration(vector.WindowS * float64(time.Second))
			signed, reason := VerifySignature(vector.Header, vector.Key, vector.AgentID, vector.Method, vector.Path,
				vector.RequestID, []byte(vector.Body), time.Unix(vector.Now, 0), window)
			want := ""
			if vector.Reason != nil {
				want = *vector.Reason
			}
			if reason != want {
				t.Fatalf("reason %q, want %q", reason, want)
			}
			if want == "" && (signed.Timestamp == 0 || signed.Nonce == "") {
				t.Fatalf("accepted without its time and nonce: %+v", signed)
			}
		})
	}
}

// --- error_codes.json ----------------------------------------------------------------------------------

type codeVector struct {
	Code       ErrorCode `json:"code"`
	HTTPStatus int       `json:"http_status"`
	CanRetry   bool      `json:"can_retry"`
}

// Every ATP code, no more and no fewer, with the Python table's status and retry; an agent's error answer
// carries both.
func TestVectorErrorCodes(t *testing.T) {
	var vectors struct {
		About string       `json:"about"`
		Codes []codeVector `json:"codes"`
	}
	loadVectors(t, "error_codes", &vectors)
	for _, vector := range vectors.Codes {
		t.Run(string(vector.Code), func(t *testing.T) {
			if !vector.Code.Known() || vector.Code.HTTPStatus() != vector.HTTPStatus ||
				vector.Code.CanRetry() != vector.CanRetry {
				t.Fatalf("known %v, status %d, can_retry %v", vector.Code.Known(), vector.Code.HTTPStatus(),
					vector.Code.CanRetry())
			}
			answer := errorReply("r", vector.Code, "m")
			var frame ErrorFrame
			if err := json.Unmarshal(answer.body, &frame); err != nil {
				t.Fatal(err)
			}
			if answer.status != vector.HTTPStatus || frame.ErrorCode != vector.Code || frame.CanRetry != vector.CanRetry {
				t.Fatalf("answered HTTP %d %s", answer.status, answer.body)
			}
		})
	}
	if len(ErrorCodes()) != len(vectors.Codes) {
		t.Fatalf("the Go table has %d codes, the Python one %d", len(ErrorCodes()), len(vectors.Codes))
	}
}

// --- contexts.json -------------------------------------------------------------------------------------

type outgoingVector struct {
	RequestID           string         `json:"request_id"`
	Context             map[string]any `json:"context"`
	ContextUpdate       map[string]any `json:"context_update"`
	ReportUsage         [2]int64       `json:"report_usage"`
	SpentByCallee       int64          `json:"spent_by_callee"`
	Explicit            map[string]any `json:"explicit"`
	Outgoing            map[string]any `json:"outgoing"`
	AnswerContextUpdate map[string]any `json:"answer_context_update"`
	Usage               *Usage         `json:"usage"`
}

type incomingVector struct {
	Context     map[string]any `json:"context"`
	Traceparent string         `json:"traceparent"`
	Expected    map[string]any `json:"expected"`
}

type hintVector struct {
	Metadata    map[string]any `json:"metadata"`
	RoutingHint map[string]any `json:"routing_hint"`
	Matches     bool           `json:"matches"`
}

type contextVectors struct {
	About        string           `json:"about"`
	Outgoing     []outgoingVector `json:"outgoing"`
	Incoming     []incomingVector `json:"incoming"`
	RoutingHints []hintVector     `json:"routing_hints"`
}

func contexts(t *testing.T) contextVectors {
	var vectors contextVectors
	loadVectors(t, "contexts", &vectors)
	return vectors
}

// A nested call made inside a handler: the frame's context inherited from the call served, the budget left,
// and the answer's context_update and usage.
func TestVectorOutgoingContexts(t *testing.T) {
	for i, vector := range contexts(t).Outgoing {
		t.Run(caseName(i, fmt.Sprint(vector.Context)), func(t *testing.T) {
			call := NewCall(vector.RequestID, "vectors.parent", vector.Context, time.Now().Add(time.Minute))
			call.UpdateContext(vector.ContextUpdate)
			// Usage is reported only when there is some, as the vectors were made: a report of 0 and 0 is a usage.
			if vector.ReportUsage != [2]int64{} {
				if err := call.ReportUsage(vector.ReportUsage[0], vector.ReportUsage[1]); err != nil {
					t.Fatal(err)
				}
			}
			call.SpentByCallee(vector.SpentByCallee)
			frame, err := NewFrame(WithCall(context.Background(), call), "vectors.child", nil,
				WithContext(vector.Explicit))
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, "outgoing context", mustEncode(t, frame.Context), vector.Outgoing)
			sameJSON(t, "answer context_update", mustEncode(t, call.AnswerContextUpdate()), vector.AnswerContextUpdate)
			usage, _ := call.answerUsage()
			sameJSON(t, "usage", mustEncode(t, usage), vector.Usage)
		})
	}
}

// The trace id a served call has: the frame's own, else the traceparent's.
func TestVectorIncomingContexts(t *testing.T) {
	for i, vector := range contexts(t).Incoming {
		t.Run(caseName(i, vector.Traceparent), func(t *testing.T) {
			sameJSON(t, "incoming context", mustEncode(t, IncomingContext(vector.Context, vector.Traceparent)),
				vector.Expected)
		})
	}
}

// routing_hint matching, as the router (and the direct fallback) filters instances.
func TestVectorRoutingHints(t *testing.T) {
	for i, vector := range contexts(t).RoutingHints {
		t.Run(caseName(i, fmt.Sprint(vector.Metadata, vector.RoutingHint)), func(t *testing.T) {
			if got := MatchesHint(vector.Metadata, vector.RoutingHint); got != vector.Matches {
				t.Fatalf("matches %v, want %v", got, vector.Matches)
			}
		})
	}
}

// --- agents.json ---------------------------------------------------------------------------------------

type heartbeatVector struct {
	AgentID       string  `json:"agent_id"`
	MaxInflight   int     `json:"max_inflight"`
	InFlight      int     `json:"in_flight"`
	Outcomes      [][]any `json:"outcomes"`
	HealthFailure *string `json:"health_failure"`
	Encoded       string  `json:"encoded"`
}

type registrationVector struct {
	AgentID        string         `json:"agent_id"`
	Zone           string         `json:"zone"`
	Service        *string        `json:"service"`
	Metadata       map[string]any `json:"metadata"`
	BaseURL        string         `json:"base_url"`
	DirectFallback bool           `json:"direct_fallback"`
	Capabilities   []Capability   `json:"capabilities"`
	Expected       map[string]any `json:"expected"`
}

type agentVectors struct {
	About         string               `json:"about"`
	Heartbeats    []heartbeatVector    `json:"heartbeats"`
	Registrations []registrationVector `json:"registrations"`
}

func agents(t *testing.T) agentVectors {
	var vectors agentVectors
	loadVectors(t, "agents", &vectors)
	return vectors
}

// pythonHealth is the Python SDK's health for a check that raised RuntimeError(message): "fail: " and the
// exception's repr. A Go check fails with an error, whose text takes the repr's place.
func pythonHealth(message string) string { return "fail: RuntimeError('" + message + "')" }

// A heartbeat's body byte for byte, after calls entered and outcomes counted.
func TestVectorHeartbeats(t *testing.T) {
	for i, vector := range agents(t).Heartbeats {
		t.Run(caseName(i, fmt.Sprintf("%d of %d, %d outcomes", vector.InFlight, vector.MaxInflight,
			len(vector.Outcomes))), func(t *testing.T) {
			config := AgentConfig{AgentID: vector.AgentID, RegistryURLs: []string{"http://127.0.0.1:9"},
				MaxInflight: vector.MaxInflight}
			want := vector.Encoded
			if vector.HealthFailure != nil {
				failure := errors.New(*vector.HealthFailure)
				config.HealthCheck = func(context.Context) error { return failure }
				python := pythonHealth(*vector.HealthFailure)
				if !strings.Contains(want, `"health":"`+python+`"`) {
					t.Fatalf("the vector's health is not %q: %s", python, want)
				}
				want = strings.Replace(want, python, "fail: "+failure.Error(), 1)
			}
			agent, err := NewAgent(config)
			if err != nil {
				t.Fatal(err)
			}
			for range vector.InFlight {
				if why := agent.inflight.enter(); why != "" {
					t.Fatalf("call refused: %s", why)
				}
			}
			for _, counted := range vector.Outcomes {
				tokens, err := counted[1].(json.Number).Int64()
				if err != nil {
					t.Fatal(err)
				}
				agent.inflight.outcome(counted[0].(string), tokens)
			}
			if got := mustEncode(t, agent.Heartbeat()); string(got) != want {
				t.Fatalf("heartbeat\n got  %s\n want %s", got, want)
			}
		})
	}
}

// A registration's body, as a JSON value.
func TestVectorRegistrations(t *testing.T) {
	for i, vector := range agents(t).Registrations {
		t.Run(caseName(i, vector.AgentID), func(t *testing.T) {
			config := AgentConfig{AgentID: vector.AgentID, RegistryURLs: []string{"http://127.0.0.1:9"},
				Zone: vector.Zone, Metadata: vector.Metadata, BaseURL: vector.BaseURL,
				DirectFallback: vector.DirectFallback}
			if vector.Service != nil {
				config.Service = *vector.Service
			}
			agent, err := NewAgent(config)
			if err != nil {
				t.Fatal(err)
			}
			for _, capability := range vector.Capabilities {
				err := agent.Capability(capability, func(context.Context, *Call) (any, error) { return nil, nil })
				if err != nil {
					t.Fatal(err)
				}
			}
			sameJSON(t, "registration", mustEncode(t, agent.Registration()), vector.Expected)
		})
	}
}

package reach

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Fuzz targets for what a peer controls: request frames at an agent, answers at a caller, signature headers,
// event streams. Each is seeded from the shared vectors and checks invariants, not only the absence of a
// panic: `go test -run='^$' -fuzz=FuzzDecodeRequestFrame -fuzztime=10s` (and the others) runs one.

// peerErrorKind names the kind of a decodePeer failure; "" for a failure of no known kind.
func peerErrorKind(err error) string {
	var syntax *json.SyntaxError
	var mistyped *json.UnmarshalTypeError
	switch {
	case errors.Is(err, errTooDeep):
		return "too deep"
	case errors.Is(err, errNotUTF8):
		return "not UTF-8"
	case errors.Is(err, errTrailing):
		return "trailing"
	case errors.As(err, &syntax):
		return "syntax"
	case errors.As(err, &mistyped):
		return "type"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	}
	return ""
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fuzzAgent serves fuzz.echo, answering its payload, on no network: its handler is called directly.
func fuzzAgent(f *testing.F) http.Handler {
	agent, err := NewAgent(AgentConfig{AgentID: "fuzz-1", RegistryURLs: []string{"http://127.0.0.1:9"},
		Logger: discardLogger()})
	if err != nil {
		f.Fatal(err)
	}
	err = agent.Capability(Capability{Name: "fuzz.echo"}, func(_ context.Context, call *Call) (any, error) {
		return call.Payload, nil
	})
	if err != nil {
		f.Fatal(err)
	}
	return agent.Handler()
}

// addRequestSeeds seeds a target with the vectors' request frames and the bodies fuzzing found wrong before.
func addRequestSeeds(f *testing.F) {
	var vectors frameVectors
	loadVectors(f, "frames", &vectors)
	for _, encoded := range vectors.Requests {
		f.Add([]byte(encoded))
	}
	f.Add([]byte(`{"capability":"fuzz.echo","payload":{"a":[1,2.5e3,-0]},"request_id":"r","timeout_hint":-1}`))
	f.Add([]byte(`{"request_id":"r"}{}`))
	// Found by this target: bytes that are not UTF-8, and a closing bracket after the value, were taken.
	f.Add([]byte("{\"payload\":{\"\xbc\":\"\"}}"))
	f.Add([]byte(`{"request_id":"r"}}`))
}

// A request frame from anyone: decoded, it re-encodes to bytes that decode to the same frame; refused, the
// error is of a known kind.
func FuzzDecodeRequestFrame(f *testing.F) {
	addRequestSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		var frame RequestFrame
		if err := decodePeer(body, &frame); err != nil {
			if peerErrorKind(err) == "" {
				t.Fatalf("decoding %q failed with an error of no known kind: %#v", body, err)
			}
			return
		}
		first := mustEncode(t, &frame)
		var again RequestFrame
		if err := decodePeer(first, &again); err != nil {
			t.Fatalf("%s re-encoded as %s, which does not decode: %v", body, first, err)
		}
		if second := mustEncode(t, &again); !bytes.Equal(first, second) {
			t.Fatalf("unstable: %s then %s", first, second)
		}
	})
}

// A Go agent answers every body with one well-formed frame: the echo of a frame it decodes, INVALID_FRAME
// for one it cannot, under the frame's request id. (Apart from FuzzDecodeRequestFrame: the handler runs on a
// goroutine of its own, so its coverage varies from run to run, which slows the fuzzer down.)
func FuzzAgentAnswersEveryBody(f *testing.F) {
	addRequestSeeds(f)
	handler := fuzzAgent(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		var frame RequestFrame
		decodeErr := decodePeer(body, &frame)
		recorder := httptest.NewRecorder()
		request := httptest.NewRequest(http.MethodPost, "/atp/fuzz.echo", bytes.NewReader(body))
		request.Header.Set(RequestIDHeader, "header-id")
		handler.ServeHTTP(recorder, request)
		answer := recorder.Body.Bytes()
		requestID := ""
		if recorder.Code == http.StatusOK {
			var response ResponseFrame
			if err := decodeFrame(answer, &response); err != nil || response.Status != "success" {
				t.Fatalf("HTTP 200 with %s (%v)", answer, err)
			}
			if echoed := compacted(t, frame.Payload); len(frame.Payload) > 0 && !bytes.Equal(response.Result, echoed) {
				t.Fatalf("payload %s echoed as %s", frame.Payload, response.Result)
			}
			requestID = response.RequestID
		} else {
			var refused ErrorFrame
			if err := decodeFrame(answer, &refused); err != nil || !refused.ErrorCode.Known() ||
				refused.ErrorCode.HTTPStatus() != recorder.Code || refused.CanRetry != refused.ErrorCode.CanRetry() {
				t.Fatalf("HTTP %d with %s (%v)", recorder.Code, answer, err)
			}
			if decodeErr != nil && refused.ErrorCode != InvalidFrame {
				t.Fatalf("an undecodable frame answered %s", answer)
			}
			requestID = refused.RequestID
		}
		switch {
		case decodeErr != nil && requestID != "header-id":
			t.Fatalf("an undecodable frame answered with request_id %q", requestID)
		case decodeErr == nil && frame.RequestID != "" && requestID != frame.RequestID:
			t.Fatalf("the frame's request_id %q answered as %q", frame.RequestID, requestID)
		case decodeErr == nil && frame.RequestID == "" && len(requestID) != 32:
			t.Fatalf("a frame without request_id answered as %q", requestID)
		}
	})
}

func compacted(t *testing.T, raw json.RawMessage) []byte {
	var out bytes.Buffer
	if len(raw) > 0 {
		if err := json.Compact(&out, raw); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

// checkDecoded checks what a caller made of an answer: exactly one frame, a known code, and a frame that
// re-encodes stably.
func checkDecoded(t *testing.T, answer *Answer, requestID string) {
	t.Helper()
	if (answer.Response == nil) == (answer.Error == nil) {
		t.Fatalf("answer %+v is not exactly one frame", answer)
	}
	if answer.Response != nil {
		if !validStatus(answer.Response.Status) || answer.Response.RequestID == "" {
			t.Fatalf("response frame %+v", answer.Response)
		}
		first := mustEncode(t, answer.Response)
		again := DecodeATP(requestID, http.StatusOK, first)
		if again.Response == nil {
			t.Fatalf("%s does not decode again: %+v", first, again.Error)
		}
		if second := mustEncode(t, again.Response); !bytes.Equal(first, second) {
			t.Fatalf("unstable: %s then %s", first, second)
		}
		return
	}
	frame := answer.Error
	if !frame.ErrorCode.Known() || frame.RequestID == "" || !utf8.ValidString(frame.ErrorMessage) {
		t.Fatalf("error frame %+v", frame)
	}
	first := mustEncode(t, frame)
	again := DecodeATP(requestID, frame.ErrorCode.HTTPStatus(), first)
	if again.Error == nil {
		t.Fatalf("%s does not decode again", first)
	}
	if second := mustEncode(t, again.Error); !bytes.Equal(first, second) {
		t.Fatalf("unstable: %s then %s", first, second)
	}
}

// An answer from anyone, ATP (an agent's or the router's) or REST: always one well-formed frame.
func FuzzDecodeResponseFrame(f *testing.F) {
	var vectors frameVectors
	loadVectors(f, "frames", &vectors)
	for _, encoded := range vectors.Responses {
		f.Add(http.StatusOK, []byte(encoded))
	}
	for _, encoded := range vectors.Errors {
		f.Add(http.StatusBadGateway, []byte(encoded))
	}
	for _, answer := range append(vectors.ATPAnswers, vectors.RESTAnswers...) {
		f.Add(answer.Status, []byte(answer.Body))
	}
	f.Add(260, []byte(`"" }`)) // found by this target: a REST answer with a bracket after its value was taken
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		atp := DecodeATP("caller-id", status, body)
		checkDecoded(t, atp, "caller-id")
		// An ATP error is the body's own frame, else the one its status stands for; a response needs HTTP 200.
		var sent ErrorFrame
		switch {
		case atp.Response != nil && status != http.StatusOK:
			t.Fatalf("HTTP %d read as a response frame", status)
		case atp.Error != nil && !reflect.DeepEqual(atp.Error, StatusError("caller-id", status, body)) &&
			(decodeFrame(body, &sent) != nil || !reflect.DeepEqual(atp.Error, &sent)):
			t.Fatalf("HTTP %d %q read as %+v", status, body, atp.Error)
		}
		rest := DecodeREST("caller-id", status, body)
		checkDecoded(t, rest, "caller-id")
		if rest.Response != nil && rest.Response.Status == "success" && len(body) > 0 &&
			!bytes.Equal(rest.Response.Result, body) {
			t.Fatalf("a REST result %s is not the body %s", rest.Response.Result, body)
		}
	})
}

// signatureReasons are the beginnings of every reason a signature is refused for.
var signatureReasons = []string{"missing ", SignatureHeader + " v1 is refused", "malformed ", "stale signature: ",
	"signature does not match this request"}

// A signature header from anyone: parsed, it prints back to a header that parses the same; refused, it is
// for one of the known reasons; accepted, it is the router's own signature of that request.
func FuzzVerifySignature(f *testing.F) {
	var vectors signatureVectors
	loadVectors(f, "signatures", &vectors)
	for _, vector := range vectors.Verifications {
		f.Add(vector.Header, []byte(vector.Body))
	}
	for _, vector := range vectors.Signatures {
		f.Add(vector.Header+",x=1", []byte(vector.Body))
	}
	signed := vectors.Signatures[0]
	now := time.Unix(signed.Now, 0)
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		parsed, ok := ParseSignature(header)
		if ok {
			printed := SignatureVersion + ",t=" + strconv.FormatInt(parsed.Timestamp, 10) + ",n=" + parsed.Nonce + ",s=" + parsed.Digest
			if again, ok := ParseSignature(printed); !ok || again != parsed {
				t.Fatalf("%q parsed as %+v, printed as %q, parsed again as %+v", header, parsed, printed, again)
			}
		}
		accepted, reason := VerifySignature(header, signed.Key, signed.AgentID, signed.Method, signed.Path,
			signed.RequestID, body, now, DefaultSignatureWindow)
		if reason == "" {
			genuine := Sign(signed.Key, signed.AgentID, signed.Method, signed.Path, signed.RequestID, body,
				time.Unix(accepted.Timestamp, 0), accepted.Nonce)
			if !ok || accepted != parsed || !strings.HasSuffix(genuine, "s="+strings.ToLower(accepted.Digest)) {
				t.Fatalf("%q accepted, but the signature of that request is %q", header, genuine)
			}
			return
		}
		if ok && strings.HasPrefix(reason, "malformed ") {
			t.Fatalf("%q parses but is refused as malformed", header)
		}
		for _, known := range signatureReasons {
			if strings.HasPrefix(reason, known) {
				return
			}
		}
		t.Fatalf("%q refused for an unknown reason: %s", header, reason)
	})
}

// An event stream from anyone, cut anywhere: the same events as uncut, each printed back to itself; and a
// caller's Stream ends it with one known outcome.
func FuzzSSE(f *testing.F) {
	var vectors frameVectors
	loadVectors(f, "frames", &vectors)
	for _, stream := range vectors.EventStreams {
		f.Add([]byte(strings.Join(stream.Pieces, "")), uint64(0x0123456789abcdef))
	}
	for _, chunk := range vectors.ChunkEvents {
		final := "event: response\ndata: " + vectors.Responses[0] + "\n\n"
		f.Add([]byte(chunk.Event+final), uint64(3))
	}
	f.Add([]byte("0000000000000\ndata: 0\r\n\r0"), uint64(81985529216486888)) // cut after a lone \r
	f.Fuzz(func(t *testing.T, stream []byte, cuts uint64) {
		var whole EventParser
		events := whole.Feed(stream)

		var cut EventParser
		var pieced []Event
		// cuts says where: each of its hex digits is the next piece's length less one, over and over.
		for rest, step := stream, cuts; len(rest) > 0; {
			size := min(len(rest), int(step%16)+1)
			pieced = append(pieced, cut.Feed(rest[:size])...)
			rest = rest[size:]
			if step >>= 4; step == 0 {
				step = cuts
			}
		}
		// A lone \r's line end is seen only with the next line end (the Python parser's rule too): cut there,
		// an event may come later, never otherwise, and a line end after the stream brings it.
		flush := []byte("\n")
		if len(pieced) > len(events) || !sameEvents(events[:len(pieced)], pieced) {
			t.Fatalf("%q: whole %q, cut %q", stream, events, pieced)
		}
		if events, pieced = append(events, whole.Feed(flush)...), append(pieced, cut.Feed(flush)...); !sameEvents(events, pieced) {
			t.Fatalf("%q and a line end: whole %q, cut %q", stream, events, pieced)
		}
		for _, event := range events {
			if event.Name == "" || !utf8.ValidString(event.Name) || bytes.ContainsAny(event.Data, "\r") {
				t.Fatalf("event %q", event)
			}
			if bytes.Contains(event.Data, []byte("\n")) {
				continue // EncodeEvent carries one data line: JSON holds no raw newline
			}
			var again EventParser
			if printed := again.Feed(EncodeEvent(event.Name, event.Data)); !sameEvents(printed, []Event{event}) {
				t.Fatalf("%q printed and parsed as %q", event, printed)
			}
		}

		reader := &Stream{ctx: context.Background(), requestID: "caller-id", url: "fuzz", response: &http.Response{
			Body: io.NopCloser(bytes.NewReader(stream))}}
		chunks := 0
		for reader.Next() {
			if data := reader.Chunk().Data; data != nil && !json.Valid(data) {
				t.Fatalf("chunk %+v: its data is not JSON", reader.Chunk())
			}
			chunks++
		}
		if chunks > len(events) {
			t.Fatalf("%d chunks out of %d events", chunks, len(events))
		}
		response, err := reader.Final()
		var failed *Error
		switch {
		case err == nil && (response == nil || response.Status != "success"):
			t.Fatalf("no error, but response %+v", response)
		case err != nil && (!errors.As(err, &failed) || !failed.Code.Known()):
			t.Fatalf("final error %#v", err)
		}
	})
}

func sameEvents(a, b []Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

// JSON nested 100,000 levels deep is refused by the depth limit, before any decoder recurses into it:
// as a request frame at an agent, an answer at a caller, a REST answer and a streamed chunk.
func TestDeeplyNestedJSONIsRefused(t *testing.T) {
	const levels = 100_000
	arrays := strings.Repeat("[", levels) + strings.Repeat("]", levels)
	objects := strings.Repeat(`{"a":`, levels) + "1" + strings.Repeat("}", levels)
	// An escaped backslash then a quote: a scanner that loses track of strings would count nothing after it.
	hidden := `{"s":"\\","deep":` + arrays + `}`
	for name, body := range map[string]string{"arrays": arrays, "objects": objects, "after a string": hidden} {
		t.Run(name, func(t *testing.T) {
			started := time.Now()
			var frame RequestFrame
			if err := decodePeer([]byte(body), &frame); !errors.Is(err, errTooDeep) {
				t.Fatalf("decoded with %v", err)
			}
			answer := DecodeATP("r", http.StatusOK, []byte(body))
			if answer.Error == nil || answer.Error.ErrorCode != AgentError {
				t.Fatalf("answer %+v", answer)
			}
			rest := DecodeREST("r", http.StatusOK, []byte(body))
			if rest.Error == nil || !strings.Contains(rest.Error.ErrorMessage, errTooDeep.Error()) {
				t.Fatalf("REST answer %+v", rest)
			}
			stream := &Stream{ctx: context.Background(), requestID: "r", url: "deep", response: &http.Response{Body: io.NopCloser(
				strings.NewReader("event: chunk\ndata: " + body + "\n\n"))}}
			if stream.Next() {
				t.Fatal("a chunk read")
			}
			if _, err := stream.Final(); !errors.Is(err, AgentError) || !strings.Contains(err.Error(), errTooDeep.Error()) {
				t.Fatalf("stream ended with %v", err)
			}
			if elapsed := time.Since(started); elapsed > 5*time.Second {
				t.Fatalf("refusing took %s", elapsed)
			}
		})
	}
	// The limit itself: MaxDepth levels decode, one more does not; brackets inside strings do not count.
	var value any
	if err := decodePeer([]byte(strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth)), &value); err != nil {
		t.Fatal(err)
	}
	if err := decodePeer([]byte(strings.Repeat("[", MaxDepth+1)+strings.Repeat("]", MaxDepth+1)), &value); !errors.Is(err, errTooDeep) {
		t.Fatalf("%d levels decoded: %v", MaxDepth+1, err)
	}
	if err := decodePeer([]byte(`"`+strings.Repeat("[", levels)+`"`), &value); err != nil {
		t.Fatal(err)
	}
}

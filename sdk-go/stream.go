package reach

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Stream is a streamed answer as it is produced: Next moves to each chunk, then Final is the outcome.
// Close hangs up, which cancels the call at the agent.
//
//	stream, err := client.Stream(ctx, "words", "reach every agent")
//	for stream.Next() { fmt.Println(string(stream.Chunk().Data)) }
//	response, err := stream.Final()
type Stream struct {
	ctx       context.Context
	requestID string
	response  *http.Response
	cancel    context.CancelFunc
	parser    EventParser
	events    []Event
	chunk     ChunkFrame
	final     *Answer
	url       string
}

// Stream reaches capability asking for a stream (through a router only: there is no direct fallback for
// streams). Routers are failed over only while none could be connected to. The error is only ctx's or the
// payload's; a failed call shows in Final.
func (c *Client) Stream(ctx context.Context, capability string, payload any, options ...CallOption) (*Stream, error) {
	frame, err := NewFrame(ctx, capability, payload, options...)
	if err != nil {
		return nil, err
	}
	frame.Stream = true
	body, err := encodeJSON(frame)
	if err != nil {
		return nil, err
	}
	exchange, cancel := exchangeContext(ctx, frame)
	var unreachable []string
	for _, router := range c.routers.order() {
		headers, err := c.headers(exchange, router, frame)
		if answer, stop := c.refusedToken(frame, err); stop {
			cancel()
			return &Stream{ctx: ctx, requestID: frame.RequestID, final: answer, cancel: func() {}}, nil
		}
		if err != nil {
			c.routers.failed(router)
			unreachable = append(unreachable, err.Error())
			continue
		}
		headers.Set("Accept", EventStream+", application/json")
		stream, err := c.open(exchange, router+"/atp", body, headers, frame.RequestID)
		if errors.Is(err, errUnreachable) {
			c.routers.failed(router)
			unreachable = append(unreachable, err.Error())
			continue
		}
		if err != nil {
			cancel()
			return nil, err
		}
		c.routers.answered(router)
		stream.ctx, stream.cancel = ctx, cancel
		if stream.final != nil {
			cancel()
		}
		return stream, nil
	}
	cancel()
	return &Stream{ctx: ctx, requestID: frame.RequestID, cancel: func() {},
		final: errorAnswer(frame.RequestID, ConnectTimeout, "Router unreachable: "+strings.Join(unreachable, "; "))}, nil
}

// open sends the frame; an answer that is not a stream (a refusal, say) is its final frame at once.
func (c *Client) open(ctx context.Context, url string, body []byte, headers http.Header,
	requestID string) (*Stream, error) {
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	request.Header = headers
	response, err := c.http.Do(request)
	if err != nil {
		answer, err := brokenExchange(ctx, url, err, requestID)
		if errors.Is(err, errSilent) {
			answer, err = errorAnswer(requestID, TotalTimeout, "the stream from "+url+" did not end in time"), nil
		}
		if err != nil {
			return nil, err
		}
		return &Stream{requestID: requestID, final: answer}, nil
	}
	if !isEventStream(response.Header) {
		defer response.Body.Close()
		raw, err := io.ReadAll(response.Body)
		if err != nil {
			return &Stream{requestID: requestID, final: errorAnswer(requestID, AgentError,
				fmt.Sprintf("the answer from %s broke: %v", url, err))}, nil
		}
		answer := DecodeATP(requestID, response.StatusCode, raw)
		answer.RetryAfter = retryAfter(response.Header)
		return &Stream{requestID: requestID, final: answer}, nil
	}
	return &Stream{requestID: requestID, response: response, url: url}, nil
}

// Next reads up to the next chunk: true with it in Chunk, false once the stream has ended (see Final).
func (s *Stream) Next() bool {
	for s.final == nil {
		if len(s.events) > 0 {
			event := s.events[0]
			s.events = s.events[1:]
			if s.take(event) {
				return true
			}
			continue
		}
		buffer := make([]byte, 32*1024)
		n, err := s.response.Body.Read(buffer)
		if n > 0 {
			s.events = append(s.events, s.parser.Feed(buffer[:n])...)
			continue
		}
		if err != nil {
			s.end(s.broken(err))
		}
	}
	return false
}

// take reads one event: true for a chunk; a final event ends the stream.
func (s *Stream) take(event Event) bool {
	switch event.Name {
	case eventChunk:
		var chunk ChunkFrame
		if err := decodePeer(event.Data, &chunk); err != nil {
			s.end(errorAnswer(s.requestID, AgentError, fmt.Sprintf("the stream from %s broke: %v", s.url, err)))
			return false
		}
		s.chunk = chunk
		return true
	case eventAnswer, eventError:
		status := http.StatusOK
		if event.Name == eventError {
			status = http.StatusBadGateway
		}
		answer := DecodeATP(s.requestID, status, event.Data)
		if (event.Name == eventAnswer) != (answer.Response != nil) {
			answer = errorAnswer(s.requestID, AgentError, fmt.Sprintf("the stream from %s broke: a malformed %s event",
				s.url, event.Name))
		}
		s.end(answer)
	}
	return false
}

func (s *Stream) broken(err error) *Answer {
	if errors.Is(err, io.EOF) {
		return errorAnswer(s.requestID, AgentError, "the stream from "+s.url+" ended without a final frame")
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return errorAnswer(s.requestID, TotalTimeout, "the stream from "+s.url+" did not end in time")
	}
	return errorAnswer(s.requestID, AgentError, fmt.Sprintf("the stream from %s broke: %v", s.url, err))
}

func (s *Stream) end(answer *Answer) {
	s.final = answer
	s.Close()
}

// Chunk is the chunk Next moved to.
func (s *Stream) Chunk() ChunkFrame { return s.chunk }

// Final is the stream's outcome once Next returned false: the response frame, or an *Error after the chunks
// that came before the failure. Before the end, it reads (and drops) the chunks left.
func (s *Stream) Final() (*ResponseFrame, error) {
	for s.Next() {
	}
	if s.ctx != nil && s.ctx.Err() != nil && s.final.Error != nil && errors.Is(s.ctx.Err(), context.Canceled) {
		return nil, s.ctx.Err()
	}
	answered(s.ctx, s.final)
	if err := failure(s.final); err != nil {
		return s.final.Response, err
	}
	return s.final.Response, nil
}

// Close hangs up (cancelling the call at the agent when it has not ended).
func (s *Stream) Close() error {
	if s.response != nil {
		_ = s.response.Body.Close()
	}
	if s.cancel != nil {
		s.cancel()
	}
	if s.final == nil {
		s.final = errorAnswer(s.requestID, Busy, "the caller closed the stream before it ended")
	}
	return nil
}

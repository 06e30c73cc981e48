package reach

import (
	"bytes"
	"strings"
)

// Server-sent events as streamed answers travel (agent_reach.sse): zero or more "chunk" events, each
// {"request_id", "seq", "data"}, then one "response" (a response frame) or "error" (an error frame).
const (
	EventStream  = "text/event-stream"
	eventChunk   = "chunk"
	eventAnswer  = "response"
	eventError   = "error"
	eventMessage = "message"
)

// Event is one server-sent event.
type Event struct {
	Name string
	Data []byte
}

// EncodeEvent is one event; data is JSON, which holds no raw newline.
func EncodeEvent(name string, data []byte) []byte {
	out := make([]byte, 0, len(name)+len(data)+16)
	out = append(out, "event: "...)
	out = append(out, name...)
	out = append(out, "\ndata: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// EventParser reads events out of a byte stream fed as it arrives (\n, \r\n or \r line ends, cut anywhere);
// comments and fields other than event and data are skipped, as the SSE standard says.
type EventParser struct {
	pending []byte
	name    string
	data    [][]byte
}

// Feed takes the next bytes received and returns the events they complete.
func (p *EventParser) Feed(received []byte) []Event {
	p.pending = append(p.pending, received...)
	if !bytes.ContainsAny(received, "\r\n") {
		return nil
	}
	text := p.pending
	held := []byte{}
	// A final \r may be the first half of \r\n: it is kept until the next byte says.
	if bytes.HasSuffix(text, []byte("\r")) {
		text, held = text[:len(text)-1], []byte("\r")
	}
	normal := bytes.ReplaceAll(bytes.ReplaceAll(text, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	lines := bytes.Split(normal, []byte("\n"))
	rest := lines[len(lines)-1]
	p.pending = append(append([]byte{}, rest...), held...)
	var events []Event
	for _, line := range lines[:len(lines)-1] {
		if len(line) == 0 {
			if len(p.data) > 0 {
				name := p.name
				if name == "" {
					name = eventMessage
				}
				events = append(events, Event{Name: name, Data: bytes.Join(p.data, []byte("\n"))})
			}
			p.name, p.data = "", nil
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			p.name = strings.ToValidUTF8(string(value), "\uFFFD")
		case "data":
			p.data = append(p.data, append([]byte{}, value...))
		}
	}
	return events
}

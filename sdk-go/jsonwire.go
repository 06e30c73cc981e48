package reach

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth is how deep a peer's JSON may nest (agent_reach.peer_json.MAX_DEPTH): deeper is malformed input.
const MaxDepth = 64

// What JSON from a peer is refused for, beside the decoder's own errors (msgspec refuses the same).
var (
	errTooDeep  = fmt.Errorf("JSON nesting exceeds the limit of %d levels", MaxDepth)
	errNotUTF8  = errors.New("not UTF-8")
	errTrailing = errors.New("trailing data after the JSON value")
)

// encodeJSON writes v as msgspec does: no HTML escaping, no trailing newline.
func encodeJSON(v any) ([]byte, error) {
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// depthExceeds says whether data nests arrays and objects deeper than limit (brackets in strings not counted).
func depthExceeds(data []byte, limit int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range data {
		switch {
		case inString:
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > limit {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// decodePeer decodes JSON a peer sent into v, refusing what is not UTF-8, nesting past MaxDepth and anything
// but whitespace after the value, and keeping numbers exact (json.Number), so a context or a payload passes
// on as it came.
func decodePeer(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	if depthExceeds(data, MaxDepth) {
		return errTooDeep
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimLeft(data[decoder.InputOffset():], " \t\r\n")) > 0 {
		return errTrailing
	}
	return nil
}

// pyFloat encodes as msgspec does (1.0, not 1), so a heartbeat's bytes are the Python SDK's.
type pyFloat float64

func (f pyFloat) MarshalJSON() ([]byte, error) {
	value := float64(f)
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return nil, fmt.Errorf("%v is not JSON", value)
	}
	if math.Abs(value) >= 1e16 {
		return []byte(strings.Replace(strconv.FormatFloat(value, 'e', -1, 64), "e+", "e", 1)), nil
	}
	text := strconv.FormatFloat(value, 'f', -1, 64)
	if !strings.Contains(text, ".") {
		text += ".0"
	}
	return []byte(text), nil
}

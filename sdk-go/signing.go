package reach

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The router's signature on forwarded calls (agent_reach.signing): HMAC-SHA256 keyed by a key derived from
// the agent's registration token, over the time, a nonce, the destination agent_id, the method, the path,
// the request id and the body's SHA-256:
//
//	X-Reach-Signature: v2,t=<unix seconds>,n=<24 hex>,s=<hex HMAC-SHA256(key, "t\nnonce\nagent_id\nMETHOD\npath\nrequest_id\nsha256(body)")>
const (
	SignatureVersion = "v2"
	// DefaultSignatureWindow is how far a signature's time may be from the agent's clock.
	DefaultSignatureWindow = 60 * time.Second
	signingLabel           = "agentreach forward signing v1"
)

// SigningKey is the key the router signs forwarded calls with, derived from the service's registration token.
func SigningKey(registrationToken string) string {
	mac := hmac.New(sha256.New, []byte(registrationToken))
	mac.Write([]byte(signingLabel))
	return hex.EncodeToString(mac.Sum(nil))
}

// signatureDigest is the hex HMAC of one request's signed string.
func signatureDigest(key string, timestamp int64, nonce, agentID, method, path, requestID string, body []byte) string {
	bodyHash := sha256.Sum256(body)
	signed := fmt.Sprintf("%d\n%s\n%s\n%s\n%s\n%s\n%s", timestamp, nonce, agentID, method, path, requestID,
		hex.EncodeToString(bodyHash[:]))
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(signed))
	return hex.EncodeToString(mac.Sum(nil))
}

// Sign is the X-Reach-Signature value for one request to the instance agentID, at now with nonce
// (24 hex digits; a random one when empty).
func Sign(key, agentID, method, path, requestID string, body []byte, now time.Time, nonce string) string {
	if nonce == "" {
		random := make([]byte, 12)
		_, _ = rand.Read(random)
		nonce = hex.EncodeToString(random)
	}
	timestamp := now.Unix()
	return fmt.Sprintf("%s,t=%d,n=%s,s=%s", SignatureVersion, timestamp, nonce,
		signatureDigest(key, timestamp, nonce, agentID, method, path, requestID, body))
}

// Signed is a parsed signature header.
type Signed struct {
	Timestamp int64
	Nonce     string
	Digest    string
}

var nonceForm = regexp.MustCompile(`^[0-9a-f]{24}$`)

func isDigits(text string) bool {
	if text == "" {
		return false
	}
	for _, c := range text {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ParseSignature reads a v2 header; ok is false when it is malformed.
func ParseSignature(header string) (Signed, bool) {
	version, rest, _ := strings.Cut(header, ",")
	fields := map[string]string{}
	for _, part := range strings.Split(rest, ",") {
		name, value, _ := strings.Cut(part, "=")
		fields[name] = value
	}
	stamp, nonce, digest := fields["t"], fields["n"], fields["s"]
	if strings.TrimSpace(version) != SignatureVersion || !isDigits(stamp) || !nonceForm.MatchString(nonce) ||
		len(digest) != 64 {
		return Signed{}, false
	}
	timestamp, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return Signed{}, false
	}
	return Signed{timestamp, nonce, digest}, true
}

// VerifySignature checks that header signs this request to agentID within window of now: the signature
// when it does, else the reason it does not (the Python SDK's words, so logs read the same).
func VerifySignature(header, key, agentID, method, path, requestID string, body []byte, now time.Time,
	window time.Duration) (Signed, string) {
	if header == "" {
		return Signed{}, "missing " + SignatureHeader + ": calls must come through the router"
	}
	parsed, ok := ParseSignature(header)
	if !ok && strings.HasPrefix(header, "v1,") {
		return Signed{}, SignatureHeader + " v1 is refused: it does not name the instance; the router must sign " +
			SignatureVersion
	}
	if !ok {
		return Signed{}, "malformed " + SignatureHeader + " (expected " + SignatureVersion +
			",t=<unix seconds>,n=<24 hex>,s=<64 hex>)"
	}
	age := float64(now.UnixNano())/1e9 - float64(parsed.Timestamp)
	windowS := window.Seconds()
	if math.Abs(age) > windowS {
		when := fmt.Sprintf("%.0f s ago", age)
		if age <= 0 {
			when = fmt.Sprintf("%.0f s in the future", -age)
		}
		return Signed{}, fmt.Sprintf("stale signature: signed %s, outside ±%.0f s (check both hosts' clocks)", when,
			windowS)
	}
	expected := signatureDigest(key, parsed.Timestamp, parsed.Nonce, agentID, method, path, requestID, body)
	if !hmac.Equal([]byte(expected), []byte(strings.ToLower(parsed.Digest))) {
		return Signed{}, "signature does not match this request (wrong key, signed for another instance, or " +
			"method, path, request id or body changed)"
	}
	return parsed, ""
}

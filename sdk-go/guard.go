package reach

import (
	"container/list"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// maxRememberedNonces bounds the replay memory; past it the oldest are forgotten first.
const maxRememberedNonces = 200_000

// seenNonces holds the nonces of accepted signatures, each until its signature leaves the window.
type seenNonces struct {
	window time.Duration
	limit  int
	order  *list.List // of nonceExpiry, nearly in expiry order (timestamps arrive nearly in order)
	until  map[string]*list.Element
}

type nonceExpiry struct {
	nonce string
	until float64
}

func newSeenNonces(window time.Duration, limit int) *seenNonces {
	return &seenNonces{window: window, limit: limit, order: list.New(), until: map[string]*list.Element{}}
}

// firstTime remembers nonce; false when it was accepted before (a replay).
func (s *seenNonces) firstTime(nonce string, timestamp int64, now time.Time) bool {
	seconds := float64(now.UnixNano()) / 1e9
	for front := s.order.Front(); front != nil; front = s.order.Front() {
		oldest := front.Value.(nonceExpiry)
		if oldest.until >= seconds && s.order.Len() < s.limit {
			break
		}
		s.order.Remove(front)
		delete(s.until, oldest.nonce)
	}
	if _, seen := s.until[nonce]; seen {
		return false
	}
	s.until[nonce] = s.order.PushBack(nonceExpiry{nonce, float64(timestamp) + s.window.Seconds()})
	return true
}

// callGuard decides which incoming calls reach a handler (agent_reach.guard): those the router signed for
// this instance, and unsigned calls marked X-Reach-Direct: 1 when the agent declared direct fallback.
type callGuard struct {
	agentID        string
	key            string // "": calls are not verified
	directFallback bool
	window         time.Duration
	paths          map[string]string // capability -> the path it was registered at (what the router signs)
	log            *slog.Logger

	mu   sync.Mutex
	seen *seenNonces
}

func newCallGuard(agentID, key string, directFallback bool, window time.Duration, log *slog.Logger) *callGuard {
	return &callGuard{agentID: agentID, key: key, directFallback: directFallback, window: window,
		paths: map[string]string{}, log: log, seen: newSeenNonces(window, maxRememberedNonces)}
}

// refusal is "" when the call may proceed, else why it may not (logged).
func (g *callGuard) refusal(capability, method string, headers http.Header, body []byte) string {
	if g.key == "" {
		return ""
	}
	requestID := headers.Get(RequestIDHeader)
	signed := headers.Get(SignatureHeader)
	_, carriesSignature := headers[http.CanonicalHeaderKey(SignatureHeader)]
	var reason string
	if !carriesSignature && headers.Get(DirectHeader) == "1" {
		if g.directFallback {
			g.log.Warn("direct_call_accepted", "capability", capability, "request_id", requestID,
				"why", "declared direct fallback (router bypassed)")
			return ""
		}
		reason = "direct calls are refused: this agent registered without direct_fallback"
	} else {
		now := time.Now()
		checked, problem := VerifySignature(signed, g.key, g.agentID, method, g.paths[capability], requestID, body, now,
			g.window)
		switch {
		case problem != "":
			reason = problem
		case g.firstTime(checked, now):
			return ""
		default:
			reason = "replayed: this signed request was already accepted"
		}
	}
	g.log.Warn("call_refused", "capability", capability, "request_id", requestID, "reason", reason)
	return "Agent " + g.agentID + " refused the call: " + reason
}

func (g *callGuard) firstTime(checked Signed, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen.firstTime(checked.Nonce, checked.Timestamp, now)
}

package reach

import (
	"sync"
)

// inflight is what an agent is doing now and has done so far: what heartbeats, draining and refusals read.
type inflight struct {
	mu       sync.Mutex
	limit    int
	draining bool
	count    int
	counters HeartbeatMetrics
	idle     chan struct{} // closed while no call is in progress
}

func newInflight(limit int) *inflight {
	idle := make(chan struct{})
	close(idle)
	return &inflight{limit: limit, idle: idle}
}

// enter admits a call, or says why not: "stopping" or "full" (a BUSY answer).
func (f *inflight) enter() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.draining {
		return "stopping"
	}
	if f.count >= f.limit {
		return "full"
	}
	if f.count == 0 {
		f.idle = make(chan struct{})
	}
	f.count++
	f.counters.Calls++
	return ""
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count--
	if f.count == 0 {
		close(f.idle)
	}
}

// outcome records how a call ended: "ok", "error", "business_error" or "timeout" (all but ok are errors).
func (f *inflight) outcome(outcome string, tokens int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if outcome != "ok" {
		f.counters.Errors++
	}
	switch outcome {
	case "business_error":
		f.counters.BusinessErrors++
	case "timeout":
		f.counters.Timeouts++
	}
	f.counters.Tokens += tokens
}

func (f *inflight) setDraining(draining bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining = draining
}

// snapshot is the load (0..1), the calls in progress and the counters, for a heartbeat.
func (f *inflight) snapshot() (float64, int, HeartbeatMetrics) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return min(1.0, float64(f.count)/float64(f.limit)), f.count, f.counters
}

// idleSignal is closed once no call is in progress.
func (f *inflight) idleSignal() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idle
}

package reach

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// URLList splits several URLs of one service, given as items or comma-separated strings (a flag), trimmed
// of spaces and a final slash.
func URLList(urls ...string) ([]string, error) {
	var cleaned []string
	for _, item := range urls {
		for _, url := range strings.Split(item, ",") {
			if url = strings.TrimRight(strings.TrimSpace(url), "/"); url != "" {
				cleaned = append(cleaned, url)
			}
		}
	}
	if len(cleaned) == 0 {
		return nil, errors.New("no URL given")
	}
	return cleaned, nil
}

// failover is several URLs of one service and which to try first: the one that answered last, then the
// others in the order given; a URL that failed waits out its own backoff (capped exponential, jittered)
// behind those that did not (agent_reach.transport.Failover).
type failover struct {
	mu       sync.Mutex
	urls     []string
	first    int
	failures []int
	readyAt  []time.Time
	base     time.Duration
	cap      time.Duration
}

func newFailover(urls []string) *failover {
	return &failover{urls: urls, failures: make([]int, len(urls)), readyAt: make([]time.Time, len(urls)),
		base: 100 * time.Millisecond, cap: 5 * time.Second}
}

// order is every URL: those ready now first (from the current one on), then the others soonest ready first.
func (f *failover) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	turn := make([]int, len(f.urls))
	for step := range turn {
		turn[step] = (f.first + step) % len(f.urls)
	}
	wait := func(i int) time.Duration { return max(0, f.readyAt[i].Sub(now)) }
	// A stable insertion sort: a handful of URLs.
	for i := 1; i < len(turn); i++ {
		for j := i; j > 0 && wait(turn[j]) < wait(turn[j-1]); j-- {
			turn[j], turn[j-1] = turn[j-1], turn[j]
		}
	}
	ordered := make([]string, len(turn))
	for i, index := range turn {
		ordered[i] = f.urls[index]
	}
	return ordered
}

func (f *failover) index(url string) int {
	for i, known := range f.urls {
		if known == url {
			return i
		}
	}
	return -1
}

// current is the URL tried first.
func (f *failover) current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.urls[f.first]
}

func (f *failover) answered(url string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.index(url)
	f.first, f.failures[i], f.readyAt[i] = i, 0, time.Time{}
}

func (f *failover) failed(url string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.index(url)
	f.failures[i]++
	delay := math.Min(float64(f.cap), float64(f.base)*math.Pow(2, float64(min(f.failures[i]-1, 16))))
	f.readyAt[i] = time.Now().Add(time.Duration(delay * (0.5 + rand.Float64()/2)))
}

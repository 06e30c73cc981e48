package reach

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// maxBackoff caps the wait between failed registry attempts.
const maxBackoff = 30 * time.Second

// RegistryRejected is the registry refusing a registration or heartbeat (4xx, e.g. a revoked token):
// retrying will not fix it.
type RegistryRejected struct {
	Status int
	Body   string
	What   string
}

func (r *RegistryRejected) Error() string {
	return fmt.Sprintf("registry refused the %s (HTTP %d): %s", r.What, r.Status, r.Body)
}

// errRegistryUnavailable is the registry not answering usefully (unreachable, timeout, 5xx).
var errRegistryUnavailable = errors.New("registry unavailable")

// Backoff is the wait after failures failed attempts in a row: capped exponential, full jitter (the fleet
// does not stampede a recovering registry).
func Backoff(interval time.Duration, failures int) time.Duration {
	limit := max(interval, min(maxBackoff, interval*10))
	ceiling := min(limit, interval*time.Duration(1<<min(failures, 16)))
	return time.Duration(float64(ceiling) * (0.5 + rand.Float64()/2))
}

// registryLink keeps one instance known to the registry: register, heartbeat, register again on
// 404 unknown_agent, deregister (agent_reach.heartbeat.RegistryLink).
type registryLink struct {
	http         *http.Client
	registries   *failover
	interval     time.Duration
	token        string
	registration func() RegisterRequest
	heartbeat    func() HeartbeatRequest
	log          *slog.Logger
	registered   atomic.Bool
	beats        atomic.Int64
}

// post is the first registry's answer that could be reached and was not a 5xx, in failover order; when
// every one answered 5xx, the last of those answers.
func (l *registryLink) post(ctx context.Context, path string, body any) (int, []byte, error) {
	encoded, err := encodeJSON(body)
	if err != nil {
		return 0, nil, err
	}
	var failures []string
	refused := false
	var refusedStatus int
	var refusedBody []byte
	timeout := max(2*time.Second, min(l.interval*2, 10*time.Second))
	for _, url := range l.registries.order() {
		status, answer, err := l.send(ctx, url+path, encoded, timeout)
		if err != nil {
			l.registries.failed(url)
			failures = append(failures, fmt.Sprintf("%s%s: %v", url, path, err))
			continue
		}
		if status >= 500 {
			// A node cut off from its store refuses changes another node may take.
			l.registries.failed(url)
			refused, refusedStatus, refusedBody = true, status, answer
			continue
		}
		l.registries.answered(url)
		return status, answer, nil
	}
	if refused {
		return refusedStatus, refusedBody, nil
	}
	return 0, nil, fmt.Errorf("%w: %s", errRegistryUnavailable, strings.Join(failures, "; "))
}

func (l *registryLink) send(ctx context.Context, url string, body []byte, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	request.Header.Set("Content-Type", "application/json")
	if l.token != "" {
		request.Header.Set("Authorization", "Bearer "+l.token)
	}
	response, err := l.http.Do(request)
	if err != nil {
		return 0, nil, err
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(response.Body, 1<<20))
	return response.StatusCode, answer, err
}

func (l *registryLink) register(ctx context.Context) error {
	request := l.registration()
	status, body, err := l.post(ctx, "/register", request)
	if err != nil {
		return err
	}
	if status >= 400 && status < 500 {
		return &RegistryRejected{Status: status, Body: string(body), What: "registration"}
	}
	if status != http.StatusOK {
		return fmt.Errorf("%w: registry answered %d to /register", errRegistryUnavailable, status)
	}
	l.registered.Store(true)
	names := make([]string, len(request.Capabilities))
	for i, capability := range request.Capabilities {
		names[i] = capability.Name
	}
	l.log.Info("registered", "capabilities", names)
	return nil
}

func (l *registryLink) beat(ctx context.Context) error {
	beat := l.heartbeat()
	status, body, err := l.post(ctx, "/heartbeat", beat)
	switch {
	case err != nil:
		return err
	case status == http.StatusNotFound:
		l.log.Warn("registry does not know this instance; registering again",
			"answer", string(body))
		l.registered.Store(false)
		return l.register(ctx)
	case status >= 400 && status < 500:
		return &RegistryRejected{Status: status, Body: string(body), What: "heartbeat"}
	case status != http.StatusOK:
		return fmt.Errorf("%w: registry answered %d to /heartbeat", errRegistryUnavailable, status)
	}
	l.beats.Add(1)
	return nil
}

// run registers until it works, then heartbeats every interval, backing off on failures, until ctx ends.
func (l *registryLink) run(ctx context.Context) {
	failures := 0
	for {
		started := time.Now()
		var err error
		if l.registered.Load() {
			err = l.beat(ctx)
		} else {
			err = l.register(ctx)
		}
		wait := l.interval - time.Since(started)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			wait = Backoff(l.interval, failures)
			var rejected *RegistryRejected
			if errors.As(err, &rejected) {
				l.log.Error("registry link failing; still serving, retrying with backoff", "error", err.Error(),
					"retry_in_s", wait.Seconds())
			} else if failures == 1 {
				l.log.Warn("registry link failing; still serving, retrying with backoff", "error", err.Error(),
					"retry_in_s", wait.Seconds())
			}
		} else if failures > 0 {
			l.log.Info("registry link restored", "failed_attempts", failures)
			failures = 0
		}
		timer := time.NewTimer(max(0, wait))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// deregister is best effort: a registry that is down will demote and evict the instance on its own.
func (l *registryLink) deregister(ctx context.Context, agentID string) {
	status, _, err := l.post(ctx, "/deregister", agentRef{AgentID: agentID})
	if err != nil {
		l.log.Warn("could not deregister; the registry will evict this instance", "error", err.Error())
		return
	}
	l.registered.Store(false)
	l.log.Info("deregistered", "status", status)
}

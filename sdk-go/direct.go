package reach

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Direct fallback: reaching an agent without the router, when no router can be reached (agent_reach.direct).
// Only instances that registered with direct_fallback and match the call's routing_hint are called, in the
// registry's order (healthy first, least loaded first); the registry's last answer per capability is kept,
// so agents are still found when the registry is down too. Every answer is marked degraded.

type directInstance struct {
	AgentID        string         `json:"agent_id"`
	Endpoint       string         `json:"endpoint"`
	Protocol       string         `json:"protocol"`
	TimeoutSLAMs   int64          `json:"timeout_sla_ms"`
	DirectFallback bool           `json:"direct_fallback"`
	Metadata       map[string]any `json:"metadata"`
	Version        string         `json:"version"`
}

type directRoute struct {
	registryURL string
	token       string
	mu          sync.Mutex
	known       map[string][]directInstance
}

func newDirectRoute(registryURL, token string) *directRoute {
	return &directRoute{registryURL: registryURL, token: token, known: map[string][]directInstance{}}
}

// instances are fresh from the registry when it answers, its last answer when it does not; nil, "" if the
// capability is unknown; a refusal (401/403) is said.
func (d *directRoute) instances(ctx context.Context, client *http.Client, capability string) ([]directInstance,
	string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	query, _ := encodeJSON(map[string]string{"capability": capability})
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, d.registryURL+"/query", bytes.NewReader(query))
	if err == nil {
		request.Header.Set("Content-Type", "application/json")
		if d.token != "" {
			request.Header.Set("Authorization", "Bearer "+d.token)
		}
		if response, err := client.Do(request); err == nil {
			body, _ := io.ReadAll(io.LimitReader(response.Body, 16<<20))
			_ = response.Body.Close()
			switch response.StatusCode {
			case http.StatusNotFound:
				d.forget(capability)
				return nil, ""
			case http.StatusOK:
				var answer struct {
					Instances []directInstance `json:"instances"`
				}
				if decodePeer(body, &answer) == nil {
					d.remember(capability, answer.Instances)
				}
			case http.StatusUnauthorized, http.StatusForbidden:
				return nil, fmt.Sprintf("the registry refused the query (HTTP %d): %s; set RegistryToken",
					response.StatusCode, truncate(string(body), 200))
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.known[capability], ""
}

func (d *directRoute) forget(capability string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.known, capability)
}

func (d *directRoute) remember(capability string, instances []directInstance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.known[capability] = instances
}

func (d *directRoute) send(ctx context.Context, client *http.Client, frame *RequestFrame,
	reason string) (*Answer, error) {
	capability := frame.Capability
	hint, isObject := frame.Context["routing_hint"].(map[string]any)
	if raw := frame.Context["routing_hint"]; raw != nil && !isObject {
		answer := errorAnswer(frame.RequestID, InvalidFrame, "context.routing_hint must be an object")
		answer.Error.Field = "context.routing_hint"
		return answer, nil
	}
	found, refused := d.instances(ctx, client, capability)
	if refused != "" {
		return errorAnswer(frame.RequestID, Unauthenticated,
			fmt.Sprintf("Router unreachable (%s) and %s", reason, refused)), nil
	}
	if found == nil {
		return errorAnswer(frame.RequestID, UnknownCapability,
			fmt.Sprintf("Router unreachable (%s) and the registry knows no capability '%s'", reason, capability)), nil
	}
	if len(hint) > 0 {
		var matching []directInstance
		for _, instance := range found {
			if MatchesHint(instance.Metadata, hint) {
				matching = append(matching, instance)
			}
		}
		if len(matching) == 0 {
			return errorAnswer(frame.RequestID, RoutingHintUnsatisfiable, fmt.Sprintf(
				"Router unreachable (%s) and, for '%s', %s", reason, capability, unsatisfiedHint(hint))), nil
		}
		found = matching
	}
	if frame.Version != "" {
		// The Go SDK does not read version constraints: it never calls a version outside the caller's.
		return errorAnswer(frame.RequestID, NoRoutableInstance, fmt.Sprintf(
			"Router unreachable (%s) and the Go SDK's direct fallback does not check version constraints", reason)), nil
	}
	var direct []directInstance
	for _, instance := range found {
		// An A2A agent's endpoint is its card, not an ATP endpoint: only the router speaks A2A to it.
		if instance.DirectFallback && instance.Protocol != "a2a" {
			direct = append(direct, instance)
		}
	}
	for attempt, instance := range direct {
		answer, err := directCall(ctx, client, instance, frame)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			continue
		}
		sla := instance.TimeoutSLAMs
		answer.route(&RouteFacts{Instance: instance.AgentID, Policy: "direct", Attempts: attempt + 1, Degraded: true,
			TimeoutSLAMs: &sla, Capability: capability, Reason: "direct_fallback"})
		return answer, nil
	}
	why := "no instance registered with direct_fallback"
	if len(direct) > 0 {
		why = fmt.Sprintf("none of the %d instances that accept direct calls answered", len(direct))
	}
	return errorAnswer(frame.RequestID, NoRoutableInstance,
		fmt.Sprintf("Router unreachable (%s) and, for '%s', %s", reason, capability, why)), nil
}

// directCall posts frame to one instance in its protocol's form; an error when nothing was sent.
func directCall(ctx context.Context, client *http.Client, instance directInstance, frame *RequestFrame) (*Answer,
	error) {
	headers := callHeaders(ctx, frame)
	headers.Set(DirectHeader, "1")
	body, decode := []byte(nil), DecodeATP
	if instance.Protocol == "rest" {
		context, err := encodeJSON(frame.Context)
		if err != nil {
			return nil, err
		}
		headers.Set(ContextHeader, string(context))
		body, decode = frame.Payload, DecodeREST
		if body == nil {
			body = []byte("null")
		}
	} else {
		encoded, err := encodeJSON(frame)
		if err != nil {
			return nil, err
		}
		body = encoded
	}
	answer, err := post(ctx, client, instance.Endpoint, body, headers, decode, frame.RequestID)
	if errors.Is(err, errSilent) {
		return errorAnswer(frame.RequestID, TotalTimeout, err.Error()), nil
	}
	return answer, err
}

// route sets the routing facts on whichever frame the answer is.
func (a *Answer) route(route *RouteFacts) {
	if a.Error != nil {
		a.Error.Route = route
	} else {
		a.Response.Route = route
	}
}

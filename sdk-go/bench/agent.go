package main

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"strconv"
	"time"

	reach "agentreach.dev/sdk-go"
)

// serveAgent is `bench agent`: the Go SDK agent, serving go.echo as examples/echo_agent.py serves
// demo.echo (the payload back after an optional delay_s, with the request and trace ids), until SIGTERM.
func serveAgent(args []string) error {
	flags := flag.NewFlagSet("bench agent", flag.ContinueOnError)
	registry := flags.String("registry", "", "registry URL")
	port := flags.Int("port", 0, "port (0: a free one)")
	agentID := flags.String("agent-id", "go-echo-bench", "agent_id")
	interval := flags.Duration("heartbeat-interval", time.Second, "heartbeat interval")
	if err := flags.Parse(args); err != nil {
		return err
	}
	agent, err := reach.NewAgent(reach.AgentConfig{AgentID: *agentID, RegistryURLs: []string{*registry},
		Zone: "local", HeartbeatInterval: *interval})
	if err != nil {
		return err
	}
	err = agent.Capability(reach.Capability{Name: goCapability, Description: "Echo the payload back",
		TimeoutSLAMs: 10_000}, echo)
	if err != nil {
		return err
	}
	return agent.Run(context.Background(), net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
}

func echo(ctx context.Context, call *reach.Call) (any, error) {
	var payload map[string]any
	if err := json.Unmarshal(call.Payload, &payload); err != nil || payload == nil {
		return nil, &reach.BusinessError{Code: "not_an_object", Message: goCapability + " expects a JSON object"}
	}
	if delay, _ := payload["delay_s"].(float64); delay > 0 {
		select {
		case <-time.After(time.Duration(delay * float64(time.Second))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return map[string]any{"echo": payload, "request_id": call.RequestID, "trace_id": call.TraceID()}, nil
}

// A Go agent for the SDK's tests against the real mesh: gotest.echo answers what it received (after
// delay_s, reporting tokens when asked), gotest.words streams the words of a string.
package main

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	reach "agentreach.dev/sdk-go"
)

type echoPayload struct {
	DelayS float64 `json:"delay_s"`
	Tokens int64   `json:"tokens"`
}

func main() {
	registry := flag.String("registry", "", "registry URL(s)")
	port := flag.Int("port", 0, "port (0: a free one)")
	agentID := flag.String("agent-id", "gotest-1", "agent_id")
	service := flag.String("service", "gotest", "service")
	interval := flag.Duration("heartbeat-interval", 3*time.Second, "heartbeat interval")
	direct := flag.Bool("direct-fallback", false, "accept direct fallback calls")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	agent, err := reach.NewAgent(reach.AgentConfig{AgentID: *agentID, RegistryURLs: []string{*registry}, Zone: "test",
		Service: *service, RegistrationToken: os.Getenv("AGENTREACH_TOKEN"), HeartbeatInterval: *interval,
		DirectFallback: *direct, Metadata: map[string]any{"lang": "go"}, Logger: logger})
	if err != nil {
		logger.Error("agent", "error", err.Error())
		os.Exit(1)
	}
	must(logger, agent.Capability(reach.Capability{Name: "gotest.echo", Description: "echo", TimeoutSLAMs: 10_000},
		func(ctx context.Context, call *reach.Call) (any, error) {
			var payload echoPayload
			_ = call.Decode(&payload)
			select {
			case <-time.After(time.Duration(payload.DelayS * float64(time.Second))):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if payload.Tokens > 0 {
				if err := call.ReportUsage(payload.Tokens, 0); err != nil {
					return nil, err
				}
			}
			call.UpdateContext(map[string]any{"served_by": *agentID})
			return map[string]any{"echo": call.Payload, "request_id": call.RequestID, "agent_id": *agentID,
				"context": call.Context}, nil
		}))
	must(logger, agent.StreamCapability(reach.Capability{Name: "gotest.words", TimeoutSLAMs: 10_000},
		func(ctx context.Context, call *reach.Call, send func(any) error) (any, error) {
			var text string
			if err := call.Decode(&text); err != nil {
				return nil, &reach.BusinessError{Code: "not_text", Message: "gotest.words expects a string"}
			}
			for _, word := range strings.Fields(text) {
				if err := send(word); err != nil {
					return nil, err
				}
				time.Sleep(20 * time.Millisecond)
			}
			return nil, nil
		}))
	must(logger, agent.Run(context.Background(), net.JoinHostPort("127.0.0.1", strconv.Itoa(*port))))
}

func must(logger *slog.Logger, err error) {
	if err != nil {
		logger.Error("agent", "error", err.Error())
		os.Exit(1)
	}
}

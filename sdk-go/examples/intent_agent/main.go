// The seed's intent-detection agent in Go: the twin of examples/intent_fastapi_after.py.
//
//	agentreach up                                                        # the mesh, auth on
//	export AGENTREACH_TOKEN=$(agentreach tokens create --service intent | jq -r .token)
//	go run ./examples/intent_agent -registry http://127.0.0.1:8081 -port 8000
//
// It serves intent.detect (version 3.2) over ATP, answering {"intent", "confidence"}; SIGTERM or Ctrl-C
// deregisters it and lets the calls in flight finish first.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	reach "agentreach.dev/sdk-go"
)

// keywords stand in for the model: the first known word wins.
var keywords = map[string]string{"refund": "refund.request", "invoice": "billing.invoice", "password": "account.reset"}

type intentRequest struct {
	Text      string `json:"text"`
	SessionID string `json:"session_id"`
}

type intentResponse struct {
	Intent     string  `json:"intent"`
	Confidence float64 `json:"confidence"`
}

func detectIntent(text string) intentResponse {
	for _, word := range strings.Fields(strings.ToLower(text)) {
		if intent, ok := keywords[word]; ok {
			return intentResponse{Intent: intent, Confidence: 0.9}
		}
	}
	return intentResponse{Intent: "smalltalk", Confidence: 0.5}
}

func main() {
	registry := flag.String("registry", envOr("AGENTREACH_REGISTRY", "http://127.0.0.1:8081"), "registry URL(s), comma-separated")
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 8000, "port to listen on (0 picks a free one)")
	agentID := flag.String("agent-id", "intent-agent-go-01", "this instance's agent_id")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	agent, err := reach.NewAgent(reach.AgentConfig{AgentID: *agentID, RegistryURLs: []string{*registry},
		Zone: "cn-east-1", RegistrationToken: os.Getenv("AGENTREACH_TOKEN"), Logger: logger})
	if err == nil {
		err = agent.Capability(reach.Capability{Name: "intent.detect", Version: "3.2",
			Description: "detect the intent of a customer's message",
			Examples:    []string{"I want a refund", "where is my invoice"}},
			func(ctx context.Context, call *reach.Call) (any, error) {
				var request intentRequest
				if err := call.Decode(&request); err != nil || request.Text == "" {
					return nil, fmt.Errorf("%w: intent.detect expects {\"text\", \"session_id\"}", reach.InvalidPayload)
				}
				return detectIntent(request.Text), nil
			})
	}
	if err == nil {
		err = agent.Run(context.Background(), net.JoinHostPort(*host, strconv.Itoa(*port)))
	}
	if err != nil {
		logger.Error("intent agent failed", "error", err.Error())
		os.Exit(1)
	}
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

// Call a capability through the mesh and print the answer frame as JSON.
//
//	export AGENTREACH_API_KEY=$(agentreach clients create --name me --trust internal --grant intent.detect | jq -r .api_key)
//	go run ./examples/caller -router http://127.0.0.1:8080 -capability intent.detect -payload '{"text": "I want a refund", "session_id": "s-1"}'
//
// It prints the response frame (exit 0), or the error frame when the call failed (exit 1).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	reach "agentreach.dev/sdk-go"
)

func main() {
	router := flag.String("router", "http://127.0.0.1:8080", "router URL(s), comma-separated")
	capability := flag.String("capability", "", "the capability to reach")
	payload := flag.String("payload", "null", "the payload, as JSON")
	session := flag.String("session-id", "demo-session", "context.session_id")
	timeout := flag.Duration("timeout", 10*time.Second, "the call's timeout")
	flag.Parse()
	if !json.Valid([]byte(*payload)) || *capability == "" {
		fmt.Fprintln(os.Stderr, "caller: -capability NAME and -payload JSON (valid JSON) are required")
		os.Exit(2)
	}
	client, err := reach.NewClient(reach.ClientConfig{RouterURLs: []string{*router},
		APIKey: os.Getenv("AGENTREACH_API_KEY")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "caller:", err)
		os.Exit(2)
	}
	frame, err := reach.NewFrame(context.Background(), *capability, json.RawMessage(*payload),
		reach.WithSession(*session), reach.WithTimeout(*timeout))
	if err != nil {
		fmt.Fprintln(os.Stderr, "caller:", err)
		os.Exit(2)
	}
	answer, err := client.Send(context.Background(), frame)
	if err != nil {
		fmt.Fprintln(os.Stderr, "caller:", err)
		os.Exit(1)
	}
	printed := any(answer.Response)
	if answer.Error != nil {
		printed = answer.Error
	}
	out, _ := json.Marshal(printed)
	fmt.Println(string(out))
	if answer.Error != nil || answer.Response.Status != "success" {
		os.Exit(1)
	}
}

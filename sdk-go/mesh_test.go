package reach_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	reach "agentreach.dev/sdk-go"
	"agentreach.dev/sdk-go/internal/localproc"
)

// End to end against the real mesh (auth on): Go agents registered with the real registry, reached through
// the real router by Go and Python callers, and a Python agent reached by the Go caller.

const pythonCall = `
import json, sys
import msgspec
from agent_reach import SyncReachClient
router, key, capability, payload = sys.argv[1:5]
with SyncReachClient(router, api_key=key) as client:
    result = client.call(capability, json.loads(payload), context={"session_id": "py-session"})
    chunks = [item.data for item in client.stream("gotest.words", "reach every agent") if hasattr(item, "seq")]
    print(json.dumps({"result": result, "route": msgspec.to_builtins(client.last_route), "chunks": chunks}))
`

func echoResult(t *testing.T, response *reach.ResponseFrame) map[string]any {
	t.Helper()
	var result map[string]any
	if err := response.Decode(&result); err != nil {
		t.Fatalf("result: %v (%s)", err, response.Result)
	}
	return result
}

func TestGoAgentCalledThroughTheRouterByGoAndPythonCallers(t *testing.T) {
	m := realMesh(t)
	m.goAgent(t, "gotest-callers-1", "gotest-callers", m.token(t, "gotest-callers"))
	caller := m.caller(t, "go-callers", nil, "gotest.*")
	ctx := contextFor(t)

	client, err := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}, APIKey: caller["api_key"].(string)})
	if err != nil {
		t.Fatal(err)
	}
	response, err := client.Call(reach.WithTraceparent(ctx, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
		"gotest.echo", map[string]any{"text": "hi"}, reach.WithSession("s-go"))
	if err != nil {
		t.Fatal(err)
	}
	result := echoResult(t, response)
	received := result["context"].(map[string]any)
	if result["agent_id"] != "gotest-callers-1" || received["session_id"] != "s-go" ||
		received["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" || response.Route.Instance != "gotest-callers-1" {
		t.Fatalf("answer %+v, route %+v", result, response.Route)
	}
	if response.ContextUpdate["served_by"] != "gotest-callers-1" {
		t.Fatalf("context_update %v", response.ContextUpdate)
	}

	// The same client's OAuth2 twin: a token from the router's /oauth/token, cached for the next call.
	oauth, err := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router},
		ClientID: caller["client_id"].(string), ClientSecret: caller["client_secret"].(string)})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := oauth.Call(ctx, "gotest.echo", "oauth"); err != nil {
			t.Fatal(err)
		}
	}

	printed := m.python(t, pythonCall, m.router, caller["api_key"].(string), "gotest.echo", `{"text": "from python"}`)
	pyResult := printed["result"].(map[string]any)
	if pyResult["echo"].(map[string]any)["text"] != "from python" ||
		pyResult["context"].(map[string]any)["session_id"] != "py-session" ||
		printed["route"].(map[string]any)["instance"] != "gotest-callers-1" {
		t.Fatalf("python caller printed %v", printed)
	}
	if fmt.Sprint(printed["chunks"]) != "[reach every agent]" {
		t.Fatalf("python stream chunks %v", printed["chunks"])
	}
}

func TestGoCallerStreamsFromAGoAgent(t *testing.T) {
	m := realMesh(t)
	m.goAgent(t, "gotest-stream-1", "gotest-stream", m.token(t, "gotest-stream"))
	caller := m.caller(t, "go-stream", nil, "gotest.*")
	client, _ := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}, APIKey: caller["api_key"].(string)})
	stream, err := client.Stream(contextFor(t), "gotest.words", "reach every agent")
	if err != nil {
		t.Fatal(err)
	}
	var words []string
	for stream.Next() {
		var word string
		_ = json.Unmarshal(stream.Chunk().Data, &word)
		words = append(words, fmt.Sprintf("%d:%s", stream.Chunk().Seq, word))
	}
	final, err := stream.Final()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(words) != "[0:reach 1:every 2:agent]" || string(final.Result) != `"agent"` ||
		final.Route.Instance != "gotest-stream-1" {
		t.Fatalf("chunks %v, final %+v", words, final)
	}

	// A business error from a streaming handler, through the router: a typed error carrying the agent's code.
	failed, err := client.Stream(contextFor(t), "gotest.words", 5)
	if err != nil {
		t.Fatal(err)
	}
	_, err = failed.Final()
	var reachError *reach.Error
	if !errors.Is(err, reach.BusinessErrorCode) || !errors.As(err, &reachError) || reachError.Business().Code != "not_text" {
		t.Fatalf("business error expected, got %v", err)
	}
}

func TestTypedErrorsFromTheRealRouter(t *testing.T) {
	m := realMesh(t)
	m.goAgent(t, "gotest-errors-1", "gotest-errors", m.token(t, "gotest-errors"))
	ctx := contextFor(t)
	ungranted := m.caller(t, "go-ungranted", nil, "nothing.here")
	client, _ := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}, APIKey: ungranted["api_key"].(string)})
	if _, err := client.Call(ctx, "gotest.echo", 1); !errors.Is(err, reach.Forbidden) {
		t.Fatalf("FORBIDDEN expected, got %v", err)
	}
	if _, err := client.Call(ctx, "nothing.here", 1); !errors.Is(err, reach.UnknownCapability) {
		t.Fatalf("UNKNOWN_CAPABILITY expected, got %v", err)
	}
	anonymous, _ := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}})
	if _, err := anonymous.Call(ctx, "gotest.echo", 1); !errors.Is(err, reach.Unauthenticated) {
		t.Fatalf("UNAUTHENTICATED expected, got %v", err)
	}

	// A budget of 10 tokens: the first call spends 50, the next is refused with the reset time.
	budgeted := m.caller(t, "go-budget", []string{"--budget-tokens", "10", "--budget-period", "hour"}, "gotest.*")
	client, _ = reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}, APIKey: budgeted["api_key"].(string)})
	if _, err := client.Call(ctx, "gotest.echo", map[string]any{"tokens": 50}); err != nil {
		t.Fatal(err)
	}
	var refused error
	waitFor(t, 10*time.Second, "BUDGET_EXHAUSTED", func() bool {
		_, refused = client.Call(ctx, "gotest.echo", map[string]any{"tokens": 1})
		return refused != nil
	})
	var reachError *reach.Error
	if !errors.Is(refused, reach.BudgetExhausted) || !errors.As(refused, &reachError) || !reachError.CanRetry ||
		reachError.RetryAfter <= 0 || reachError.Frame.ResetAt == "" {
		t.Fatalf("BUDGET_EXHAUSTED with Retry-After expected, got %#v", refused)
	}
}

func TestForgedAndUnsignedCallsAreRefusedByAGoAgent(t *testing.T) {
	m := realMesh(t)
	m.goAgent(t, "gotest-forged-1", "gotest-forged", m.token(t, "gotest-forged"))
	endpoint := m.agent("gotest-forged-1")["capabilities"].([]any)[0].(map[string]any)["endpoint"].(string)
	body := []byte(`{"request_id":"forged-1","capability":"gotest.echo","payload":1}`)
	forgedKey := reach.SigningKey("art_not-the-token")
	for name, signature := range map[string]string{
		"unsigned": "",
		"forged":   reach.Sign(forgedKey, "gotest-forged-1", "POST", "/atp/gotest.echo", "forged-1", body, time.Now(), ""),
	} {
		request, _ := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(body))
		request.Header.Set(reach.RequestIDHeader, "forged-1")
		if signature != "" {
			request.Header.Set(reach.SignatureHeader, signature)
		}
		response, err := http.DefaultClient.Do(request)
		if err != nil {
			t.Fatal(err)
		}
		var frame reach.ErrorFrame
		_ = json.NewDecoder(response.Body).Decode(&frame)
		_ = response.Body.Close()
		if response.StatusCode != http.StatusUnauthorized || frame.ErrorCode != reach.Unauthenticated {
			t.Fatalf("%s call: HTTP %d %+v", name, response.StatusCode, frame)
		}
	}
}

func TestGoAgentRegistersAgainWhenTheRegistryForgetsIt(t *testing.T) {
	m := realMesh(t)
	token := m.token(t, "gotest-again")
	m.goAgent(t, "gotest-again-1", "gotest-again", token)
	first := m.agent("gotest-again-1")["registered_at"].(float64)
	request, _ := http.NewRequest(http.MethodPost, m.registry+"/deregister",
		bytes.NewReader([]byte(`{"agent_id": "gotest-again-1"}`)))
	request.Header.Set("Authorization", "Bearer "+token)
	response, err := http.DefaultClient.Do(request)
	if err != nil || response.StatusCode != http.StatusOK {
		t.Fatalf("deregister: %v %v", err, response)
	}
	_ = response.Body.Close()
	// The next heartbeat is answered 404 unknown_agent: the agent registers again.
	waitFor(t, 10*time.Second, "a new registration", func() bool {
		record := m.agent("gotest-again-1")
		return record != nil && record["registered_at"].(float64) > first && record["state"] == "healthy"
	})
}

// failedCall is a call that failed and when it was sent.
type failedCall struct {
	err  error
	sent time.Time
}

// calls keeps calling gotest.echo until stop is closed; every failure is reported on failures.
func calls(client *reach.Client, t *testing.T, stop <-chan struct{}, count *atomic.Int64, failures chan<- failedCall,
	wg *sync.WaitGroup) {
	defer wg.Done()
	ctx := contextFor(t)
	for {
		select {
		case <-stop:
			return
		default:
		}
		sent := time.Now()
		if _, err := client.Call(ctx, "gotest.echo", map[string]any{"delay_s": 0.01}); err != nil {
			failures <- failedCall{err, sent}
		}
		count.Add(1)
	}
}

func TestDrainOnSIGTERMAndFailoverOnKillLoseNoCall(t *testing.T) {
	m := realMesh(t)
	token := m.token(t, "gotest-drain")
	first := m.goAgent(t, "gotest-drain-1", "gotest-drain", token)
	second := m.goAgent(t, "gotest-drain-2", "gotest-drain", token)
	third := m.goAgent(t, "gotest-drain-3", "gotest-drain", token)
	caller := m.caller(t, "go-drain", nil, "gotest.*")
	client, _ := reach.NewClient(reach.ClientConfig{RouterURLs: []string{m.router}, APIKey: caller["api_key"].(string)})
	ctx := contextFor(t)

	// A slow call in flight at the first instance when it is told to stop: it finishes, and calls keep
	// succeeding on the others meanwhile.
	slow := make(chan error, 1)
	go func() {
		_, err := client.Call(ctx, "gotest.echo", map[string]any{"delay_s": 1.0})
		slow <- err
	}()
	var busy string
	waitFor(t, 10*time.Second, "the slow call in flight", func() bool {
		for _, id := range []string{"gotest-drain-1", "gotest-drain-2", "gotest-drain-3"} {
			if record := m.agent(id); record != nil && record["inflight"].(float64) == 1 {
				busy = id
				return true
			}
		}
		return false
	})
	draining := map[string]*exec.Cmd{"gotest-drain-1": first, "gotest-drain-2": second, "gotest-drain-3": third}[busy]
	stop := make(chan struct{})
	failures := make(chan failedCall, 1000)
	var wg sync.WaitGroup
	var made atomic.Int64
	wg.Add(4)
	for range 4 {
		go calls(client, t, stop, &made, failures, &wg)
	}
	if err := draining.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, busy+" deregistered", func() bool { return m.agent(busy) == nil })
	if err := <-slow; err != nil {
		t.Fatalf("the call in flight during the drain failed: %v", err)
	}
	if err := draining.Wait(); err != nil {
		t.Fatalf("the drained agent exited with %v", err)
	}

	// One of the two left is killed outright: the calls it was serving are lost (sent, so never sent again:
	// gotest.echo has no retry policy), every call sent after is failed over to the last one.
	var killed *exec.Cmd
	for id, agent := range map[string]*exec.Cmd{"gotest-drain-1": first, "gotest-drain-2": second, "gotest-drain-3": third} {
		if id != busy {
			killed = agent
			break
		}
	}
	if err := killed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = killed.Wait()
	killedAt := time.Now()
	afterKill := made.Load()
	waitFor(t, 10*time.Second, "calls after the kill", func() bool { return made.Load() >= afterKill+40 })
	close(stop)
	wg.Wait()
	close(failures)
	for failed := range failures {
		if failed.sent.After(killedAt) || !errors.Is(failed.err, reach.AgentError) {
			t.Errorf("a call failed during the drain or after the kill: %v", failed.err)
		}
	}
}

func TestGoCallerReachesAPythonAgentThroughTheRouterAndDirectly(t *testing.T) {
	m := realMesh(t)
	token := m.token(t, "echo-go-test")
	python := process(t, []string{"AGENTREACH_TOKEN=" + token}, filepath.Join(m.venv, "bin", "python"),
		filepath.Join("..", "examples", "echo_agent.py"), "--registry", m.registry, "--port", "0",
		"--agent-id", "py-echo-for-go", "--heartbeat-interval", "0.3")
	_ = python
	m.waitState(t, "py-echo-for-go", "healthy")
	caller := m.caller(t, "go-to-python", nil, "demo.echo")

	command := exec.Command(filepath.Join(m.bin, "caller"), "-router", m.router, "-capability", "demo.echo",
		"-payload", `{"text": "hello from go"}`)
	command.Env = append(command.Environ(), "AGENTREACH_API_KEY="+caller["api_key"].(string))
	out, err := command.Output()
	if err != nil {
		t.Fatalf("caller example: %v: %s", err, out)
	}
	var printed reach.ResponseFrame
	if err := json.Unmarshal(out, &printed); err != nil {
		t.Fatalf("caller printed %s", out)
	}
	result := echoResult(t, &printed)
	if result["echo"].(map[string]any)["text"] != "hello from go" || printed.Route.Instance != "py-echo-for-go" {
		t.Fatalf("caller printed %s", out)
	}

	// No router answers: the direct fallback finds the Python agent through the registry (it declared it).
	direct, _ := reach.NewClient(reach.ClientConfig{RouterURLs: []string{"http://127.0.0.1:9"}, DirectFallback: true,
		RegistryURL: m.registry, RegistryToken: token})
	response, err := direct.Call(contextFor(t), "demo.echo", map[string]any{"text": "direct"},
		reach.WithRoutingHint(map[string]any{"zone": "local"}))
	if err != nil {
		t.Fatal(err)
	}
	if !response.Route.Degraded || response.Route.Policy != "direct" || response.Route.Instance != "py-echo-for-go" {
		t.Fatalf("direct route %+v", response.Route)
	}
	_, err = direct.Call(contextFor(t), "demo.echo", 1, reach.WithRoutingHint(map[string]any{"zone": "elsewhere"}))
	if !errors.Is(err, reach.RoutingHintUnsatisfiable) {
		t.Fatalf("ROUTING_HINT_UNSATISFIABLE expected, got %v", err)
	}
}

func TestTheIntentAgentExampleAnswersAPythonCaller(t *testing.T) {
	m := realMesh(t)
	port, _ := localproc.FreePort()
	process(t, []string{"AGENTREACH_TOKEN=" + m.token(t, "intent")}, filepath.Join(m.bin, "intent_agent"),
		"-registry", m.registry, "-port", fmt.Sprint(port))
	m.waitState(t, "intent-agent-go-01", "healthy")
	caller := m.caller(t, "py-intent", nil, "intent.detect")
	printed := m.python(t, `
import json, sys
from agent_reach import SyncReachClient
with SyncReachClient(sys.argv[1], api_key=sys.argv[2]) as client:
    print(json.dumps(client.call("intent.detect", {"text": "I want a refund", "session_id": "s-1"})))
`, m.router, caller["api_key"].(string))
	if printed["intent"] != "refund.request" || printed["confidence"] != 0.9 {
		t.Fatalf("intent answer %v", printed)
	}
}

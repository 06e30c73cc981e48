// The Go SDK against the Python SDK, one command (from sdk-go): `go run ./bench [-venv ../.venv] [-seconds 10]`.
//
// It starts the real mesh (`agentreach up --auth off` from the venv), a Go SDK agent (this program, run as
// `bench agent`) serving go.echo and the Python SDK's echo agent (examples/echo_agent.py) serving demo.echo:
// the same echo, whose answer is the payload with the request and trace ids. Then paired rounds drive each
// at the same concurrency, alternating which goes first: through the router (the Go SDK's client, POST
// /atp) and, with -modes router,direct, straight at each agent's ATP endpoint. Per target: the best and the
// median round's calls/s, the latency, and the agent process's CPU time per call (the steadier figure on a
// shared machine); the Go/Python ratios side by side. A table on stdout, then the same as JSON (also to
// -json FILE).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The capabilities, one per SDK; calls carry bench/common.py's PAYLOAD.
const (
	goCapability     = "go.echo"
	pythonCapability = "demo.echo"
	payload          = `{"text":"hello, agent","n":1}`
)

type settings struct {
	venv        string
	echoAgent   string
	seconds     int
	rounds      int
	concurrency int
	modes       []string
	jsonPath    string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		if err := serveAgent(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench agent:", err)
			os.Exit(1)
		}
		return
	}
	config, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	report, err := run(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	printTable(report)
	encoded, _ := json.MarshalIndent(report, "", "  ")
	fmt.Println(string(encoded))
	if config.jsonPath != "" {
		if err := os.WriteFile(config.jsonPath, append(encoded, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
}

func parseFlags(args []string) (settings, error) {
	flags := flag.NewFlagSet("bench", flag.ContinueOnError)
	venv := flags.String("venv", "../.venv", "the project's virtualenv (agentreach, python)")
	echoAgent := flags.String("echo-agent", "", "the Python SDK's echo agent (default: examples/echo_agent.py "+
		"of the repository holding the venv)")
	seconds := flags.Int("seconds", 10, "seconds per round")
	rounds := flags.Int("rounds", 3, "rounds per mode (each target once a round)")
	concurrency := flags.Int("concurrency", 16, "calls in flight at once, for each target alike")
	modes := flags.String("modes", "router,direct", "router (through the router), direct (at the agents), or both")
	jsonPath := flags.String("json", "", "also write the JSON report here")
	if err := flags.Parse(args); err != nil {
		return settings{}, err
	}
	if *seconds < 1 || *rounds < 1 || *concurrency < 1 {
		return settings{}, errors.New("-seconds, -rounds and -concurrency must be at least 1")
	}
	venvDir, err := filepath.Abs(*venv)
	if err != nil {
		return settings{}, err
	}
	if _, err := os.Stat(filepath.Join(venvDir, "bin", "agentreach")); err != nil {
		return settings{}, fmt.Errorf("no agentreach in %s/bin: -venv names the project's virtualenv", venvDir)
	}
	if *echoAgent == "" {
		*echoAgent = filepath.Join(filepath.Dir(venvDir), "examples", "echo_agent.py")
	}
	if _, err := os.Stat(*echoAgent); err != nil {
		return settings{}, fmt.Errorf("the Python echo agent: %w (set -echo-agent)", err)
	}
	config := settings{venv: venvDir, echoAgent: *echoAgent, seconds: *seconds, rounds: *rounds,
		concurrency: *concurrency, jsonPath: *jsonPath}
	for _, mode := range strings.Split(*modes, ",") {
		if mode != "router" && mode != "direct" {
			return settings{}, fmt.Errorf("-modes: %q is neither router nor direct", mode)
		}
		config.modes = append(config.modes, mode)
	}
	return config, nil
}

// run starts everything, measures each mode, and stops everything whatever happened.
func run(config settings) (*report, error) {
	work, err := os.MkdirTemp("", "sdk-go-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	started, err := startAll(config, work)
	defer started.stop()
	if err != nil {
		return nil, err
	}
	result := &report{Machine: describeMachine(config.venv), Seconds: config.seconds, Rounds: config.rounds,
		Concurrency: config.concurrency, Modes: map[string]*modeResult{}}
	for _, mode := range config.modes {
		targets, err := started.targets(mode)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "%s: %d rounds of %d s at %d calls in flight\n", mode, config.rounds, config.seconds,
			config.concurrency)
		result.Modes[mode] = pairedRounds(targets, config)
	}
	return result, nil
}

// pairedRounds warms each target up for 2 s, then runs rounds of both, the order swapped every other round
// so neither always follows the other.
func pairedRounds(targets [2]*target, config settings) *modeResult {
	for _, each := range targets {
		each.run(context.Background(), 2*time.Second, config.concurrency)
	}
	runs := [2][]roundResult{}
	for round := range config.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			measured := targets[i].run(context.Background(), time.Duration(config.seconds)*time.Second,
				config.concurrency)
			runs[i] = append(runs[i], measured)
			fmt.Fprintf(os.Stderr, "  round %d %-7s %8.0f calls/s  %6.1f us agent CPU/call  p50 %.2f ms  errors %d\n",
				round+1, targets[i].name, measured.CallsPerS, measured.AgentCPUUsPerCall, measured.P50Ms,
				measured.Errors)
		}
	}
	goSide, pythonSide := summarize(runs[0]), summarize(runs[1])
	return &modeResult{Go: goSide, Python: pythonSide, BestRatio: goSide.BestCallsPerS / pythonSide.BestCallsPerS,
		MedianRatio: goSide.MedianCallsPerS / pythonSide.MedianCallsPerS,
		CPURatio:    pythonSide.AgentCPUUsPerCall / goSide.AgentCPUUsPerCall}
}

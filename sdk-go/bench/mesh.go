package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	reach "agentreach.dev/sdk-go"
	"agentreach.dev/sdk-go/internal/localproc"
)

// The processes of one run: the mesh and the two agents, each in its own process, on loopback.

type processes struct {
	mesh, goAgent, pythonAgent *exec.Cmd
	registry, router           string
	client                     *reach.Client
}

// startAll starts the mesh, then both agents, and waits until the router routes to each; what did start is
// in the result (to stop) even on an error.
func startAll(config settings, work string) (*processes, error) {
	ports, err := sparePorts(3)
	if err != nil {
		return &processes{}, err
	}
	started := &processes{registry: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		router: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	started.mesh, err = spawn(work, "mesh", filepath.Join(config.venv, "bin", "agentreach"), "up",
		"--registry-port", strconv.Itoa(ports[0]), "--router-port", strconv.Itoa(ports[1]),
		"--console-port", strconv.Itoa(ports[2]), "--auth", "off", "--log-level", "warning",
		"--data-dir", filepath.Join(work, "data"))
	if err != nil {
		return started, err
	}
	for _, url := range []string{started.registry + "/healthz", started.router + "/healthz"} {
		if err := localproc.WaitUntil(60*time.Second, func() bool { return answers(url) }); err != nil {
			return started, fmt.Errorf("%s never answered (log in %s): %w", url, work, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return started, err
	}
	started.goAgent, err = spawn(work, "go-agent", self, "agent", "-registry", started.registry, "-port", "0")
	if err != nil {
		return started, err
	}
	started.pythonAgent, err = spawn(work, "python-agent", filepath.Join(config.venv, "bin", "python"),
		config.echoAgent, "--registry", started.registry, "--port", "0", "--agent-id", "py-echo-bench",
		"--heartbeat-interval", "1")
	if err != nil {
		return started, err
	}
	started.client, err = reach.NewClient(reach.ClientConfig{RouterURLs: []string{started.router}})
	if err != nil {
		return started, err
	}
	for _, capability := range []string{goCapability, pythonCapability} {
		routed := func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := started.client.Call(ctx, capability, json.RawMessage(payload))
			return err == nil
		}
		if err := localproc.WaitUntil(60*time.Second, routed); err != nil {
			return started, fmt.Errorf("the router never routed %s (logs in %s): %w", capability, work, err)
		}
	}
	return started, nil
}

// targets are the Go agent's and the Python agent's, reached in mode.
func (p *processes) targets(mode string) ([2]*target, error) {
	result := [2]*target{}
	for i, side := range []struct {
		name, capability string
		process          *exec.Cmd
	}{{"go", goCapability, p.goAgent}, {"python", pythonCapability, p.pythonAgent}} {
		call := p.throughRouter(side.capability)
		if mode == "direct" {
			endpoint, err := p.endpoint(side.capability)
			if err != nil {
				return result, err
			}
			call = direct(endpoint, side.capability)
		}
		result[i] = &target{name: side.name, pid: side.process.Process.Pid, call: call}
	}
	return result, nil
}

func (p *processes) throughRouter(capability string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := p.client.Call(ctx, capability, json.RawMessage(payload))
		return err
	}
}

// endpoint is where the registry says capability's one instance serves ATP.
func (p *processes) endpoint(capability string) (string, error) {
	query, _ := json.Marshal(map[string]string{"capability": capability})
	response, err := http.Post(p.registry+"/query", "application/json", bytes.NewReader(query))
	if err != nil {
		return "", err
	}
	defer response.Body.Close()
	var found struct {
		Instances []struct {
			Endpoint string `json:"endpoint"`
		} `json:"instances"`
	}
	if err := json.NewDecoder(response.Body).Decode(&found); err != nil || len(found.Instances) != 1 {
		return "", fmt.Errorf("the registry's instances of %s: %v (HTTP %d, %d found)", capability, err,
			response.StatusCode, len(found.Instances))
	}
	return found.Instances[0].Endpoint, nil
}

// direct posts a frame to an agent's ATP endpoint, as the router forwards one, and reads the answer as a
// caller does.
func direct(endpoint, capability string) func(context.Context) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	return func(ctx context.Context) error {
		frame := fmt.Sprintf(`{"capability":%q,"payload":%s,"request_id":%q}`, capability, payload,
			reach.NewRequestID())
		request, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader([]byte(frame)))
		if err != nil {
			return err
		}
		request.Header.Set("Content-Type", "application/json")
		response, err := client.Do(request)
		if err != nil {
			return err
		}
		defer response.Body.Close()
		var body bytes.Buffer
		if _, err := body.ReadFrom(response.Body); err != nil {
			return err
		}
		answer := reach.DecodeATP("bench", response.StatusCode, body.Bytes())
		if answer.Error != nil {
			return errors.New(answer.Error.ErrorMessage)
		}
		if answer.Response.Status != "success" {
			return fmt.Errorf("status %s", answer.Response.Status)
		}
		return nil
	}
}

// stop ends the agents, then the mesh (SIGTERM, then SIGKILL past 15 s).
func (p *processes) stop() {
	for _, process := range []*exec.Cmd{p.goAgent, p.pythonAgent, p.mesh} {
		localproc.Stop(process, 15*time.Second)
	}
}

// spawn starts a process in work, its output in work/<name>.log.
func spawn(work, name, program string, args ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(work, name+".log"))
	if err != nil {
		return nil, err
	}
	command := exec.Command(program, args...)
	command.Dir, command.Stdout, command.Stderr = work, log, log
	if err := command.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return command, nil
}

func answers(url string) bool {
	response, err := http.Get(url)
	if err != nil {
		return false
	}
	_ = response.Body.Close()
	return response.StatusCode == http.StatusOK
}

// sparePorts are n distinct ports of 127.0.0.1 a child can bind (localproc.FreePort).
func sparePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		port, err := localproc.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = port
	}
	return ports, nil
}

package reach_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentreach.dev/sdk-go/internal/localproc"
)

// The real mesh for the end-to-end tests: `agentreach up` (auth on) from the project's venv on loopback
// ports, started once for the package; Go agents and examples built once into a temporary directory.
// Without the venv the tests are skipped, unless AGENTREACH_E2E=required (tests/test_sdk_go.py sets it).

type mesh struct {
	dir      string
	venv     string
	registry string
	router   string
	adminKey string
	process  *exec.Cmd
	bin      string
}

var (
	sharedMesh *mesh
	meshError  error
	meshOnce   sync.Once
	binDir     string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedMesh != nil {
		localproc.Stop(sharedMesh.process, 10*time.Second)
	}
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// venvDir is the project's virtualenv: $AGENTREACH_VENV, else ../.venv.
func venvDir() string {
	if dir := os.Getenv("AGENTREACH_VENV"); dir != "" {
		return dir
	}
	dir, _ := filepath.Abs(filepath.Join("..", ".venv"))
	return dir
}

func realMesh(t *testing.T) *mesh {
	t.Helper()
	venv := venvDir()
	if _, err := os.Stat(filepath.Join(venv, "bin", "agentreach")); err != nil {
		if os.Getenv("AGENTREACH_E2E") == "required" {
			t.Fatalf("the real mesh is required but %s/bin/agentreach is missing", venv)
		}
		t.Skipf("no %s/bin/agentreach: the end-to-end tests need the project's venv", venv)
	}
	meshOnce.Do(func() { sharedMesh, meshError = startMesh(venv) })
	if meshError != nil {
		t.Fatalf("starting the mesh: %v", meshError)
	}
	return sharedMesh
}

func startMesh(venv string) (*mesh, error) {
	dir, err := os.MkdirTemp("", "sdk-go-mesh-")
	if err != nil {
		return nil, err
	}
	binDir = dir
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = localproc.FreePort(); err != nil {
			return nil, err
		}
	}
	log, err := os.Create(filepath.Join(dir, "mesh.log"))
	if err != nil {
		return nil, err
	}
	process := exec.Command(filepath.Join(venv, "bin", "agentreach"), "up", "--registry-port", fmt.Sprint(ports[0]),
		"--router-port", fmt.Sprint(ports[1]), "--console-port", fmt.Sprint(ports[2]), "--log-level", "warning",
		"--data-dir", filepath.Join(dir, "data"))
	process.Dir, process.Stdout, process.Stderr = dir, log, log
	if err := process.Start(); err != nil {
		return nil, err
	}
	m := &mesh{dir: dir, venv: venv, registry: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		router: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), process: process, bin: filepath.Join(dir, "bin")}
	for _, url := range []string{m.registry + "/healthz", m.router + "/healthz"} {
		if err := localproc.WaitUntil(20*time.Second, func() bool { return httpStatus(url) == http.StatusOK }); err != nil {
			localproc.Stop(process, 10*time.Second)
			out, _ := os.ReadFile(filepath.Join(dir, "mesh.log"))
			return nil, fmt.Errorf("%s never answered; the mesh's log:\n%s", url, out)
		}
	}
	key, err := os.ReadFile(filepath.Join(dir, "data", "admin.key"))
	if err != nil {
		localproc.Stop(process, 10*time.Second)
		return nil, err
	}
	m.adminKey = strings.TrimSpace(string(key))
	build := exec.Command(goTool(), "build", "-o", m.bin+string(os.PathSeparator), "./internal/testagent",
		"./examples/intent_agent", "./examples/caller")
	if out, err := build.CombinedOutput(); err != nil {
		localproc.Stop(process, 10*time.Second)
		return nil, fmt.Errorf("go build: %v: %s", err, out)
	}
	return m, nil
}

func goTool() string {
	if path, err := exec.LookPath("go"); err == nil {
		return path
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

func waitFor(t *testing.T, timeout time.Duration, what string, condition func() bool) {
	t.Helper()
	if err := localproc.WaitUntil(timeout, condition); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func httpStatus(url string) int {
	response, err := http.Get(url)
	if err != nil {
		return 0
	}
	_ = response.Body.Close()
	return response.StatusCode
}

// cli runs the agentreach command against the mesh and decodes its JSON output.
func (m *mesh) cli(t *testing.T, args ...string) map[string]any {
	t.Helper()
	args = append(args, "--registry", m.registry, "--data-dir", filepath.Join(m.dir, "data"))
	command := exec.Command(filepath.Join(m.venv, "bin", "agentreach"), args...)
	command.Dir = m.dir
	out, err := command.Output()
	if err != nil {
		t.Fatalf("agentreach %v: %v", args, err)
	}
	var printed map[string]any
	if err := json.Unmarshal(out, &printed); err != nil {
		t.Fatalf("agentreach %v printed %s", args, out)
	}
	return printed
}

// token is a registration token for service.
func (m *mesh) token(t *testing.T, service string) string {
	return m.cli(t, "tokens", "create", "--service", service)["token"].(string)
}

// caller is a client granted grants; its api_key, client_id and client_secret.
func (m *mesh) caller(t *testing.T, name string, extra []string, grants ...string) map[string]any {
	args := []string{"clients", "create", "--name", name, "--trust", "internal"}
	for _, grant := range grants {
		args = append(args, "--grant", grant)
	}
	return m.cli(t, append(args, extra...)...)
}

// agent is the registry's record of agentID (nil once it is gone).
func (m *mesh) agent(agentID string) map[string]any {
	request, _ := http.NewRequest(http.MethodGet, m.registry+"/agents/"+agentID, nil)
	request.Header.Set("X-API-Key", m.adminKey)
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		return nil
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return nil
	}
	var record map[string]any
	_ = json.NewDecoder(response.Body).Decode(&record)
	return record
}

func (m *mesh) waitState(t *testing.T, agentID, state string) map[string]any {
	t.Helper()
	var record map[string]any
	waitFor(t, 20*time.Second, agentID+" "+state, func() bool {
		record = m.agent(agentID)
		return record != nil && record["state"] == state
	})
	return record
}

// process is a child process of the test, its output in the test's temp dir, stopped (SIGTERM) at cleanup.
func process(t *testing.T, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), filepath.Base(name)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	command := exec.Command(name, args...)
	command.Env = append(os.Environ(), env...)
	command.Stdout, command.Stderr = log, log
	if err := command.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		localproc.Stop(command, 10*time.Second)
		if t.Failed() {
			_, _ = log.Seek(0, io.SeekStart)
			out, _ := io.ReadAll(log)
			t.Logf("%s output:\n%s", name, out)
		}
		_ = log.Close()
	})
	return command
}

// goAgent starts the test agent registered as agentID of service with a fresh token (returned).
func (m *mesh) goAgent(t *testing.T, agentID, service, token string, extra ...string) *exec.Cmd {
	args := append([]string{"-registry", m.registry, "-agent-id", agentID, "-service", service,
		"-heartbeat-interval", "300ms"}, extra...)
	agent := process(t, []string{"AGENTREACH_TOKEN=" + token}, filepath.Join(m.bin, "testagent"), args...)
	m.waitState(t, agentID, "healthy")
	return agent
}

// python runs code with the venv's interpreter and decodes the JSON it prints.
func (m *mesh) python(t *testing.T, code string, args ...string) map[string]any {
	t.Helper()
	command := exec.Command(filepath.Join(m.venv, "bin", "python"), append([]string{"-c", code}, args...)...)
	var stderr bytes.Buffer
	command.Stderr = &stderr
	out, err := command.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var printed map[string]any
	if err := json.Unmarshal(out, &printed); err != nil {
		t.Fatalf("python printed %q (%s)", out, stderr.String())
	}
	return printed
}

func contextFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

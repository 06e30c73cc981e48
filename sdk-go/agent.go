package reach

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Handler serves one call of a capability: its result (any JSON-encodable value), a *BusinessError for a
// well-formed answer the caller cannot use, or another error (answered AGENT_ERROR). ctx ends at the call's
// deadline; calls made with it through a Client inherit the call's context.
type Handler func(ctx context.Context, call *Call) (any, error)

// StreamHandler serves a streamed capability: each send is one chunk, written at once when the caller asked
// for a stream (send fails once the caller has left: return). The result is what it returns, or its last
// chunk when it returns nil (all a caller that does not stream receives).
type StreamHandler func(ctx context.Context, call *Call, send func(chunk any) error) (any, error)

// AgentConfig is an agent's identity in the mesh and how it joins it (agent_reach.AgentReachSDK).
type AgentConfig struct {
	AgentID string
	// RegistryURLs: one registry or several (each item may be comma-separated) to fail over between.
	RegistryURLs []string
	Zone         string
	// Service defaults to the agent_id at the registry.
	Service  string
	Metadata map[string]any
	// RegistrationToken joins the mesh with auth on; with it, calls the router did not sign are refused.
	RegistrationToken string
	// HeartbeatInterval defaults to 3 s.
	HeartbeatInterval time.Duration
	// DirectFallback: callers may reach this agent without the router when no router answers.
	DirectFallback bool
	// MaxInflight calls at once (64); past it, new calls are answered BUSY.
	MaxInflight int
	// BaseURL is where the mesh reaches this agent: set by Start when it serves its own port, required by
	// Join when Handler is mounted on a server of your own.
	BaseURL string
	// PathPrefix is where Handler is mounted on your server ("" for the root): /atp/{capability} and
	// /healthz are served (and registered) under it.
	PathPrefix string
	// DrainTimeout bounds how long Stop waits for calls in flight (30 s).
	DrainTimeout time.Duration
	// SkipVerify serves calls the router did not sign even with a registration token.
	SkipVerify bool
	// SignatureWindow is how far a signature's time may be from this host's clock (60 s).
	SignatureWindow time.Duration
	// HealthCheck, when set, decides /healthz and the heartbeats' health (an error: unhealthy).
	HealthCheck func(ctx context.Context) error
	Logger      *slog.Logger
	// HTTPClient talks to the registry and the router's completion URL.
	HTTPClient *http.Client
}

// Defaults of a declared capability (the registry's own).
const (
	DefaultTimeoutSLAMs    = 30_000
	DefaultMaxPayloadBytes = 1024 * 1024
	frameEnvelopeBytes     = 64 * 1024
	healthTimeout          = 2 * time.Second
	abandonGrace           = 2 * time.Second
)

var capabilityName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

type native struct {
	capability Capability
	handler    Handler
	stream     StreamHandler
}

// Agent is one instance's membership in the mesh, from declaration to leaving cleanly.
type Agent struct {
	config     AgentConfig
	log        *slog.Logger
	http       *http.Client
	inflight   *inflight
	guard      *callGuard
	natives    map[string]*native
	order      []string
	mux        *http.ServeMux
	registries []string

	mu         sync.Mutex
	link       *registryLink
	stopLink   context.CancelFunc
	linkDone   chan struct{}
	server     *http.Server
	listener   net.Listener
	serveDone  chan struct{}
	abandon    context.Context
	abandonAll context.CancelFunc
	started    bool
	stopped    bool
	health     string
}

// NewAgent checks config and fills its defaults.
func NewAgent(config AgentConfig) (*Agent, error) {
	if !capabilityName.MatchString(config.AgentID) || len(config.AgentID) > 128 {
		return nil, fmt.Errorf("agent_id %q is not a registry name", config.AgentID)
	}
	registries, err := URLList(config.RegistryURLs...)
	if err != nil {
		return nil, fmt.Errorf("RegistryURLs: %w", err)
	}
	if config.HeartbeatInterval <= 0 {
		config.HeartbeatInterval = 3 * time.Second
	}
	if config.MaxInflight <= 0 {
		config.MaxInflight = 64
	}
	if config.DrainTimeout <= 0 {
		config.DrainTimeout = 30 * time.Second
	}
	if config.SignatureWindow <= 0 {
		config.SignatureWindow = DefaultSignatureWindow
	}
	config.PathPrefix = strings.TrimRight(config.PathPrefix, "/")
	if config.PathPrefix != "" && !strings.HasPrefix(config.PathPrefix, "/") {
		return nil, fmt.Errorf("PathPrefix %q must start with /", config.PathPrefix)
	}
	log := config.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("agent_id", config.AgentID)
	client := config.HTTPClient
	if client == nil {
		client = &http.Client{CheckRedirect: noRedirects}
	}
	key := ""
	if config.RegistrationToken != "" && !config.SkipVerify {
		key = SigningKey(config.RegistrationToken)
	}
	abandon, abandonAll := context.WithCancel(context.Background())
	agent := &Agent{config: config, log: log, http: client, inflight: newInflight(config.MaxInflight),
		guard:   newCallGuard(config.AgentID, key, config.DirectFallback, config.SignatureWindow, log),
		natives: map[string]*native{}, registries: registries, abandon: abandon, abandonAll: abandonAll,
		health: "ok"}
	agent.mux = http.NewServeMux()
	agent.mux.HandleFunc("POST "+config.PathPrefix+"/atp/{capability}", agent.serveCall)
	agent.mux.HandleFunc("GET "+config.PathPrefix+"/healthz", agent.serveHealth)
	return agent, nil
}

// noRedirects keeps credentials from following a redirect anywhere.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Capability declares a capability served by handler (Name required; zero fields take the defaults).
func (a *Agent) Capability(capability Capability, handler Handler) error {
	return a.declare(capability, &native{handler: handler})
}

// StreamCapability declares a capability whose handler streams its answer chunk by chunk.
func (a *Agent) StreamCapability(capability Capability, handler StreamHandler) error {
	return a.declare(capability, &native{stream: handler})
}

func (a *Agent) declare(capability Capability, served *native) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started {
		return errors.New("capabilities are declared before the agent starts")
	}
	name := capability.Name
	if !capabilityName.MatchString(name) || len(name) > 128 {
		return fmt.Errorf("capability name %q: letters, digits and ._:- up to 128, starting with a letter or digit",
			name)
	}
	if _, taken := a.natives[name]; taken {
		return fmt.Errorf("capability %q is declared twice on agent %q", name, a.config.AgentID)
	}
	capability.Endpoint = a.config.PathPrefix + "/atp/" + name
	capability.Protocol = "atp"
	if capability.Version == "" {
		capability.Version = "1.0"
	}
	if capability.TimeoutSLAMs <= 0 {
		capability.TimeoutSLAMs = DefaultTimeoutSLAMs
	}
	if capability.MaxPayloadBytes <= 0 {
		capability.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if capability.Examples == nil {
		capability.Examples = []string{}
	}
	served.capability = capability
	a.natives[name] = served
	a.order = append(a.order, name)
	a.guard.paths[name] = capability.Endpoint
	return nil
}

// Handler serves the agent's ATP endpoint (POST {PathPrefix}/atp/{capability}) and {PathPrefix}/healthz:
// mount it on an existing net/http server, then Join.
func (a *Agent) Handler() http.Handler { return a.mux }

// BaseURL is where the mesh reaches this agent.
func (a *Agent) BaseURL() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.config.BaseURL
}

// Registration is what the agent registers.
func (a *Agent) Registration() RegisterRequest {
	capabilities := make([]Capability, 0, len(a.order))
	for _, name := range a.order {
		capabilities = append(capabilities, a.natives[name].capability)
	}
	metadata := map[string]any{"zone": a.config.Zone}
	for name, value := range a.config.Metadata {
		metadata[name] = value
	}
	baseURL := a.BaseURL()
	health := a.config.PathPrefix + "/healthz"
	request := RegisterRequest{AgentID: a.config.AgentID, Capabilities: capabilities, BaseURL: &baseURL,
		HealthURL: &health, Metadata: metadata, DirectFallback: a.config.DirectFallback}
	if a.config.Service != "" {
		request.Service = &a.config.Service
	}
	return request
}

// checkHealth runs the health check; its result goes out with the next heartbeat too.
func (a *Agent) checkHealth(ctx context.Context) (bool, string) {
	detail := "ok"
	if a.config.HealthCheck != nil {
		ctx, cancel := context.WithTimeout(ctx, healthTimeout)
		defer cancel()
		if err := a.config.HealthCheck(ctx); err != nil {
			detail = truncate("fail: "+err.Error(), 256)
		}
	}
	a.mu.Lock()
	a.health = detail
	a.mu.Unlock()
	return detail == "ok", detail
}

func truncate(text string, limit int) string {
	if len(text) <= limit {
		return text
	}
	return text[:limit]
}

// Heartbeat is the body of the agent's next heartbeat.
func (a *Agent) Heartbeat() HeartbeatRequest {
	_, health := a.checkHealth(context.Background())
	load, count, counters := a.inflight.snapshot()
	return HeartbeatRequest{AgentID: a.config.AgentID, Load: pyFloat(load), Inflight: int64(count), Health: health,
		Metrics: &counters}
}

func (a *Agent) serveHealth(w http.ResponseWriter, r *http.Request) {
	healthy, detail := a.checkHealth(r.Context())
	status := http.StatusOK
	if !healthy {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, struct {
		Status  string `json:"status"`
		AgentID string `json:"agent_id"`
	}{detail, a.config.AgentID})
}

// Start serves the agent on addr ("127.0.0.1:0" picks a free port), then joins the registry.
func (a *Agent) Start(ctx context.Context, addr string) error {
	if len(a.natives) == 0 {
		return fmt.Errorf("agent %q declares no capability; nothing to register", a.config.AgentID)
	}
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	limit := int64(0)
	for _, served := range a.natives {
		limit = max(limit, served.capability.MaxPayloadBytes)
	}
	server := &http.Server{Handler: a.mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 75 * time.Second}
	a.mu.Lock()
	if a.config.BaseURL == "" {
		a.config.BaseURL = "http://" + advertised(listener.Addr().(*net.TCPAddr))
	}
	a.server, a.listener, a.serveDone = server, listener, make(chan struct{})
	a.mu.Unlock()
	go func() {
		defer close(a.serveDone)
		if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("agent server stopped", "error", err.Error())
		}
	}()
	a.log.Info("agent listening", "base_url", a.BaseURL(), "capabilities", a.order)
	if err := a.Join(ctx); err != nil {
		_ = server.Close()
		return err
	}
	return nil
}

func advertised(addr *net.TCPAddr) string {
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			host = name
		}
	}
	return net.JoinHostPort(host, fmt.Sprint(addr.Port))
}

// Join registers the agent and starts its heartbeats (every HeartbeatInterval, with load and in-flight
// counts; a 404 unknown_agent registers again). A registry that cannot be reached is retried in the
// background while the agent serves; one that refuses the registration (4xx) is an error.
func (a *Agent) Join(ctx context.Context) error {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return fmt.Errorf("agent %q is already started", a.config.AgentID)
	}
	if a.config.BaseURL == "" {
		a.mu.Unlock()
		return errors.New("the agent's base URL is unknown: set AgentConfig.BaseURL when mounting Handler")
	}
	a.started = true
	a.mu.Unlock()
	if a.guard.key == "" && a.config.RegistrationToken != "" {
		a.log.Warn("SkipVerify is on: calls that bypass the router are served")
	}
	link := &registryLink{http: a.http, registries: newFailover(a.registries), interval: a.config.HeartbeatInterval,
		token: a.config.RegistrationToken, registration: a.Registration, heartbeat: a.Heartbeat, log: a.log}
	if err := link.register(ctx); err != nil {
		var rejected *RegistryRejected
		if errors.As(err, &rejected) {
			a.mu.Lock()
			a.started = false
			a.mu.Unlock()
			return err
		}
		a.log.Warn("registry unreachable at start; serving anyway and registering when it is back",
			"error", err.Error())
	}
	a.inflight.setDraining(false)
	linkCtx, stopLink := context.WithCancel(context.Background())
	a.mu.Lock()
	a.link, a.stopLink, a.linkDone = link, stopLink, make(chan struct{})
	a.mu.Unlock()
	go func() {
		defer close(a.linkDone)
		link.run(linkCtx)
	}()
	return nil
}

// Registered says whether the registry has taken the agent's latest registration.
func (a *Agent) Registered() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.link != nil && a.link.registered.Load()
}

// Stop leaves the mesh cleanly: new calls are answered BUSY, the agent deregisters, calls in flight finish
// (up to DrainTimeout; then they are abandoned, each caller answered BUSY), then its own server closes.
func (a *Agent) Stop(ctx context.Context) error {
	a.mu.Lock()
	if !a.started || a.stopped {
		a.mu.Unlock()
		return nil
	}
	a.stopped = true
	link, stopLink, linkDone, server := a.link, a.stopLink, a.linkDone, a.server
	a.mu.Unlock()
	a.inflight.setDraining(true)
	_, count, _ := a.inflight.snapshot()
	a.log.Info("stopping: deregistering and draining", "inflight", count)
	stopLink()
	<-linkDone
	link.deregister(ctx, a.config.AgentID)
	if !waitClosed(ctx, a.inflight.idleSignal(), a.config.DrainTimeout) {
		a.log.Warn("drain deadline passed; abandoning calls still running", "drain_timeout_s",
			a.config.DrainTimeout.Seconds())
		a.abandonAll()
		waitClosed(ctx, a.inflight.idleSignal(), abandonGrace)
	}
	if server != nil {
		shutdown, cancel := context.WithTimeout(ctx, abandonGrace)
		defer cancel()
		if err := server.Shutdown(shutdown); err != nil {
			_ = server.Close()
		}
		<-a.serveDone
	}
	a.log.Info("stopped")
	return nil
}

func waitClosed(ctx context.Context, signal <-chan struct{}, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-signal:
		return true
	case <-timer.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// Run serves the agent on addr until ctx ends or the process gets SIGTERM or SIGINT, then stops cleanly
// (blocking; for an agent's main).
func (a *Agent) Run(ctx context.Context, addr string) error {
	signalled, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := a.Start(ctx, addr); err != nil {
		return err
	}
	<-signalled.Done()
	return a.Stop(context.Background())
}

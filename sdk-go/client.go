package reach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// answerGrace is how long past a call's timeout the client waits, so the router's own TOTAL_TIMEOUT frame
// arrives first.
const answerGrace = time.Second

// ClientConfig says which routers a caller reaches and with what credential (agent_reach.ReachClient).
type ClientConfig struct {
	// RouterURLs: one router or several (each item may be comma-separated). A call moves to the next only
	// when nothing was sent to one; any other failure is the caller's answer, never sent again.
	RouterURLs []string
	// APIKey is a client's API key (X-API-Key).
	APIKey string
	// ClientID and ClientSecret: OAuth2 client credentials, exchanged at each router's /oauth/token for a
	// token cached until 30 s before it expires.
	ClientID     string
	ClientSecret string
	// DirectFallback: when no router can be reached, call an instance found through RegistryURL that
	// registered with direct fallback (and matches the call's routing_hint) directly, marked degraded.
	DirectFallback bool
	RegistryURL    string
	// RegistryToken is a registration token, for the direct fallback's registry queries (auth on).
	RegistryToken string
	// ConnectTimeout bounds opening a connection (1 s).
	ConnectTimeout time.Duration
	// HTTPClient replaces the client's own (whose dialer's errors tell "nothing was sent" apart).
	HTTPClient *http.Client
}

// Client calls capabilities through the router. Safe for concurrent use.
type Client struct {
	config      ClientConfig
	http        *http.Client
	routers     *failover
	credentials map[string]*clientCredentials
	direct      *directRoute
}

// NewClient checks config and builds a client.
func NewClient(config ClientConfig) (*Client, error) {
	routers, err := URLList(config.RouterURLs...)
	if err != nil {
		return nil, fmt.Errorf("RouterURLs: %w", err)
	}
	if (config.ClientID == "") != (config.ClientSecret == "") {
		return nil, errors.New("ClientID and ClientSecret go together")
	}
	if config.DirectFallback && config.RegistryURL == "" {
		return nil, errors.New("DirectFallback needs RegistryURL: that is where agents are found without the router")
	}
	if config.ConnectTimeout <= 0 {
		config.ConnectTimeout = time.Second
	}
	client := config.HTTPClient
	if client == nil {
		client = newHTTPClient(config.ConnectTimeout)
	}
	c := &Client{config: config, http: client, routers: newFailover(routers),
		credentials: map[string]*clientCredentials{}}
	if config.ClientID != "" {
		// One token endpoint per router: a token one router issues is accepted by every router of the mesh.
		for _, router := range routers {
			c.credentials[router] = &clientCredentials{tokenURL: router + "/oauth/token", clientID: config.ClientID,
				clientSecret: config.ClientSecret}
		}
	}
	if config.DirectFallback {
		c.direct = newDirectRoute(strings.TrimRight(config.RegistryURL, "/"), config.RegistryToken)
	}
	return c, nil
}

// newHTTPClient keeps connections alive to each router, never follows redirects (the headers carry
// credentials), and uses no proxy.
func newHTTPClient(connectTimeout time.Duration) *http.Client {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &http.Client{Transport: transport, CheckRedirect: noRedirects}
}

// RouterURL is the router that answered last (calls go there first).
func (c *Client) RouterURL() string { return c.routers.current() }

// CallOption shapes one call's frame.
type CallOption func(*RequestFrame, *callSettings)

type callSettings struct {
	context map[string]any
	timeout time.Duration
}

// WithContext sets context members (session_id, user_id, routing_hint, token_budget, budget, ... ).
func WithContext(fields map[string]any) CallOption {
	return func(_ *RequestFrame, s *callSettings) {
		for name, value := range fields {
			s.context[name] = value
		}
	}
}

// WithSession sets context.session_id (the hash key and the token budget's scope).
func WithSession(sessionID string) CallOption {
	return WithContext(map[string]any{"session_id": sessionID})
}

// WithUser sets context.user_id.
func WithUser(userID string) CallOption { return WithContext(map[string]any{"user_id": userID}) }

// WithTokenBudget sets context.token_budget: the session's token cap at the router.
func WithTokenBudget(tokens int64) CallOption {
	return WithContext(map[string]any{"token_budget": tokens})
}

// WithRoutingHint sets context.routing_hint: labels an instance's metadata must match (a hard filter).
func WithRoutingHint(labels map[string]any) CallOption {
	return WithContext(map[string]any{"routing_hint": labels})
}

// WithTimeout is the caller's own deadline (timeout_hint); a ctx deadline sooner than it wins.
func WithTimeout(timeout time.Duration) CallOption {
	return func(_ *RequestFrame, s *callSettings) { s.timeout = timeout }
}

// WithVersion constrains the capability's version (">=3.2", "^3", "~3.2", "3.2.1", ">=3,<4").
func WithVersion(constraint string) CallOption {
	return func(f *RequestFrame, _ *callSettings) { f.Version = constraint }
}

// WithRequestID sets the call's request id (default: a new one).
func WithRequestID(requestID string) CallOption {
	return func(f *RequestFrame, _ *callSettings) { f.RequestID = requestID }
}

// NewFrame is the frame of a call made with ctx: the context inherited from the call ctx serves (if any),
// the options' members over it, and timeout_hint from the option or ctx's deadline, whichever is sooner.
func NewFrame(ctx context.Context, capability string, payload any, options ...CallOption) (*RequestFrame, error) {
	encoded, err := encodeJSON(payload)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	frame := &RequestFrame{Capability: capability, Payload: encoded, RequestID: NewRequestID()}
	settings := &callSettings{context: map[string]any{}}
	for _, option := range options {
		option(frame, settings)
	}
	frame.Context = OutgoingContext(ctx, settings.context)
	timeout := settings.timeout
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if timeout <= 0 || left < timeout {
			timeout = left
		}
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	if timeout > 0 {
		hint := max(timeout.Milliseconds(), 1)
		frame.TimeoutHint = &hint
	}
	return frame, nil
}

// Call reaches capability with payload: the response frame of a call that succeeded, else an *Error
// (errors.Is(err, reach.Busy), ...) or ctx's error. Inside a handler, pass the handler's ctx: the call
// carries the incoming context and deadline, and its tokens count against the incoming budget.
func (c *Client) Call(ctx context.Context, capability string, payload any,
	options ...CallOption) (*ResponseFrame, error) {
	frame, err := NewFrame(ctx, capability, payload, options...)
	if err != nil {
		return nil, err
	}
	answer, err := c.Send(ctx, frame)
	if err != nil {
		return nil, err
	}
	answered(ctx, answer)
	if err := failure(answer); err != nil {
		return answer.Response, err
	}
	return answer.Response, nil
}

// answered notes the tokens a nested call cost the handler making it.
func answered(ctx context.Context, answer *Answer) {
	call := CallFrom(ctx)
	if call == nil || answer.Response == nil {
		return
	}
	if spent, ok := wholeNumber(answer.Response.ContextUpdate["tokens_used"]); ok {
		call.SpentByCallee(spent)
	}
}

// exchangeContext is the context a request runs under: the frame's timeout plus a grace (the router's own
// TOTAL_TIMEOUT frame arrives first), ended early only when the caller cancels.
func exchangeContext(ctx context.Context, frame *RequestFrame) (context.Context, context.CancelFunc) {
	detached, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if frame.TimeoutHint != nil {
		var cancelTimeout context.CancelFunc
		detached, cancelTimeout = context.WithTimeout(detached,
			time.Duration(*frame.TimeoutHint)*time.Millisecond+answerGrace)
		previous := cancel
		cancel = func() { cancelTimeout(); previous() }
	}
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	return detached, func() { stop(); cancel() }
}

// Send sends frame and returns its answer, whatever it says: the error is only ctx's (the caller
// cancelled) or a frame that cannot be encoded. A router nothing was sent to is left for the next one;
// one that let the call time out without a word goes behind the others for the calls that follow.
func (c *Client) Send(ctx context.Context, frame *RequestFrame) (*Answer, error) {
	body, err := encodeJSON(frame)
	if err != nil {
		return nil, err
	}
	exchange, cancel := exchangeContext(ctx, frame)
	defer cancel()
	var unreachable []string
	for _, router := range c.routers.order() {
		headers, err := c.headers(exchange, router, frame)
		if answer, stop := c.refusedToken(frame, err); stop {
			return answer, nil
		}
		if err != nil {
			c.routers.failed(router)
			unreachable = append(unreachable, err.Error())
			continue
		}
		answer, err := post(exchange, c.http, router+"/atp", body, headers, DecodeATP, frame.RequestID)
		switch {
		case errors.Is(err, errSilent):
			c.routers.failed(router)
			return errorAnswer(frame.RequestID, TotalTimeout, err.Error()), nil
		case errors.Is(err, errUnreachable):
			c.routers.failed(router)
			unreachable = append(unreachable, err.Error())
			continue
		case err != nil:
			return nil, err
		}
		c.routers.answered(router)
		return answer, nil
	}
	reason := strings.Join(unreachable, "; ")
	if c.direct == nil {
		return errorAnswer(frame.RequestID, ConnectTimeout, "Router unreachable: "+reason), nil
	}
	return c.direct.send(exchange, c.http, frame, reason)
}

// refusedToken is the answer when the token endpoint refused the client's credentials.
func (c *Client) refusedToken(frame *RequestFrame, err error) (*Answer, bool) {
	var refused *tokenRefused
	if errors.As(err, &refused) {
		return errorAnswer(frame.RequestID, Unauthenticated, refused.Error()), true
	}
	return nil, false
}

// headers are a call's headers to router: its id, its trace and the client's credential.
func (c *Client) headers(ctx context.Context, router string, frame *RequestFrame) (http.Header, error) {
	headers := callHeaders(ctx, frame)
	if c.config.APIKey != "" {
		headers.Set(APIKeyHeader, c.config.APIKey)
	}
	if credentials := c.credentials[router]; credentials != nil {
		authorization, err := credentials.authorization(ctx, c.http)
		if err != nil {
			return nil, err
		}
		headers.Set("Authorization", authorization)
	}
	return headers, nil
}

func callHeaders(ctx context.Context, frame *RequestFrame) http.Header {
	headers := http.Header{}
	headers.Set("Content-Type", "application/json")
	headers.Set(RequestIDHeader, frame.RequestID)
	if parent := outgoingTraceparent(ctx, frame.Context); parent != "" {
		headers.Set(TraceparentHeader, parent)
	}
	return headers
}

// Session is a conversation with the mesh: each call carries the session's context, and each answer's
// context_update is merged into it for the calls that follow.
type Session struct {
	client  *Client
	context map[string]any
}

// Session starts a conversation whose calls carry initial as their context.
func (c *Client) Session(initial map[string]any) *Session {
	return &Session{client: c, context: MergeContextUpdate(nil, initial)}
}

// Context is the context the session's next call carries.
func (s *Session) Context() map[string]any { return MergeContextUpdate(nil, s.context) }

// Call is Client.Call with the session's context; a successful answer's context_update joins it.
func (s *Session) Call(ctx context.Context, capability string, payload any,
	options ...CallOption) (*ResponseFrame, error) {
	options = append([]CallOption{WithContext(s.context)}, options...)
	response, err := s.client.Call(ctx, capability, payload, options...)
	if err == nil {
		s.context = MergeContextUpdate(s.context, response.ContextUpdate)
	}
	return response, err
}

// MergeContextUpdate is context with an answer's context_update over it, member by member; tokens_used is
// the callee's spend, not context, and is left out.
func MergeContextUpdate(callContext, update map[string]any) map[string]any {
	merged := make(map[string]any, len(callContext)+len(update))
	for name, value := range callContext {
		merged[name] = value
	}
	for name, value := range update {
		if name != "tokens_used" {
			merged[name] = value
		}
	}
	return merged
}

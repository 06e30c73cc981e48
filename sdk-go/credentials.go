package reach

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// expiryMargin: a token is refreshed this long before it expires, so no call leaves with one about to lapse.
const expiryMargin = 30 * time.Second

// tokenRefused is the token endpoint refusing or answering nonsense (transport failures are not: asking
// again, elsewhere, is always safe).
type tokenRefused struct{ message string }

func (t *tokenRefused) Error() string { return t.message }

// clientCredentials is OAuth2 client credentials for one router: one token, fetched when needed, reused
// until near expiry (agent_reach.credentials).
type clientCredentials struct {
	tokenURL     string
	clientID     string
	clientSecret string

	mu      sync.Mutex
	token   string
	expires time.Time
}

// authorization is the Authorization header value; a transport failure is returned as errUnreachable.
func (c *clientCredentials) authorization(ctx context.Context, client *http.Client) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == "" || !time.Now().Before(c.expires) {
		token, lifetime, err := c.fetch(ctx, client)
		if err != nil {
			return "", err
		}
		c.token, c.expires = token, time.Now().Add(max(0, lifetime-expiryMargin))
	}
	return "Bearer " + c.token, nil
}

func (c *clientCredentials) fetch(ctx context.Context, client *http.Client) (string, time.Duration, error) {
	form := url.Values{"grant_type": {"client_credentials"}}.Encode()
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, c.tokenURL, strings.NewReader(form))
	if err != nil {
		return "", 0, &tokenRefused{err.Error()}
	}
	request.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	request.SetBasicAuth(c.clientID, c.clientSecret)
	response, err := client.Do(request)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %s: %v", errUnreachable, c.tokenURL, err)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(io.LimitReader(response.Body, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("%w: %s: %v", errUnreachable, c.tokenURL, err)
	}
	if response.StatusCode != http.StatusOK {
		return "", 0, &tokenRefused{fmt.Sprintf("%s answered %d: %s", c.tokenURL, response.StatusCode,
			truncate(string(body), 200))}
	}
	var answer struct {
		AccessToken string   `json:"access_token"`
		ExpiresIn   *float64 `json:"expires_in"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.AccessToken == "" {
		return "", 0, &tokenRefused{c.tokenURL + " answered without a token"}
	}
	lifetime := 3600.0
	if answer.ExpiresIn != nil {
		lifetime = *answer.ExpiresIn
	}
	return answer.AccessToken, time.Duration(lifetime * float64(time.Second)), nil
}

package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
)

// Principal is the caller as its token says.
type Principal struct {
	OrgID string `json:"org_id"`
	Sub   string `json:"sub"`
	// Roles are from admin, agent, approver and operator.
	Roles []string `json:"roles"`
	// AgentID is set for a token bound to an agent.
	AgentID string `json:"agent_id,omitempty"`
}

// Readiness is the answer of GET /readyz: each dependency's state, "ok" or
// "down: <reason>".
type Readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// Whoami returns the caller's principal.
func (c *Client) Whoami(ctx context.Context, opts ...CallOption) (Principal, error) {
	return doJSON[Principal](ctx, c, endpoint{method: http.MethodGet, path: "/v1/whoami"}, nil, opts)
}

// Healthz reports whether the process is up (nil error).
func (c *Client) Healthz(ctx context.Context, opts ...CallOption) error {
	return doNoContent(ctx, c, endpoint{method: http.MethodGet, path: "/healthz"}, nil, opts)
}

// Readyz reports whether the server is ready: Postgres answers. Not ready
// is an *Error with status 503 whose Extensions["checks"] says, per
// dependency, "ok" or "down: <reason>"; a ready answer may still report
// Temporal down in Checks (the server queues the signals meanwhile).
// Its answers are not retried (a probe wants the state now); like any
// call, it is when its connection could not even be opened (RetryPolicy).
func (c *Client) Readyz(ctx context.Context, opts ...CallOption) (Readiness, error) {
	return doJSON[Readiness](ctx, c, endpoint{method: http.MethodGet, path: "/readyz", safety: unsafe}, nil, opts)
}

// OpenAPI returns the API's OpenAPI document.
func (c *Client) OpenAPI(ctx context.Context, opts ...CallOption) (json.RawMessage, error) {
	return doJSON[json.RawMessage](ctx, c, endpoint{method: http.MethodGet, path: "/openapi.json"}, nil, opts)
}

// Metrics returns the server's Prometheus metrics in the text format.
func (c *Client) Metrics(ctx context.Context, opts ...CallOption) ([]byte, error) {
	var out []byte
	ep := endpoint{method: http.MethodGet, path: "/metrics", accept: "text/plain"}
	err := c.do(ctx, ep, nil, opts, func(res *http.Response) error {
		var err error
		out, err = io.ReadAll(res.Body)
		return err
	})
	return out, err
}

package client

import (
	"context"
	"encoding/json"
	"iter"
	"net/http"
	"net/url"
	"time"
)

// WakeupsService calls the wake-up routes (/v1/wakeups).
type WakeupsService struct{ c *Client }

// WakeupRequest is the body of POST /v1/wakeups: spend Cost from the
// agent's mandate for Scope, then run Work in Pool and signal the workflow
// with its outcome.
type WakeupRequest struct {
	AgentID string `json:"agent_id"`
	// WorkflowID must start with "<org_id>/" (an org id holding "/" owns
	// no workflow).
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id,omitempty"`
	// Signal is the signal name the workflow waits on.
	Signal string `json:"signal"`
	Scope  string `json:"scope"`
	Reason string `json:"reason,omitempty"`
	Cost   int64  `json:"cost"`
	// Pool runs the work (default "wakeup").
	Pool string     `json:"pool,omitempty"`
	Work WakeupWork `json:"work"`
}

// WakeupWork is the work a wake-up runs.
type WakeupWork struct {
	// Handler is a registered handler, e.g. "http".
	Handler string `json:"handler"`
	// Args is the handler's JSON input: any value that marshals to JSON
	// (a json.RawMessage is sent as is).
	Args      any          `json:"args,omitempty"`
	Retry     *RetryConfig `json:"retry,omitempty"`
	TimeoutMS int          `json:"timeout_ms,omitempty"`
	// ConcurrencyKey groups the org's work: at most KeyLimit items of one
	// key run at a time, in run_at order (KeyLimit 0: the server's 1).
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	KeyLimit       int    `json:"key_limit,omitempty"`
}

// RetryConfig is a work item's retry policy: the wait before attempt n+1
// is InitialBackoffMS·Base^(n−1), scaled by a random factor in [0.5, 1.5).
type RetryConfig struct {
	// MaxAttempts counts the first attempt.
	MaxAttempts      int     `json:"max_attempts"`
	InitialBackoffMS int     `json:"initial_backoff_ms,omitempty"`
	Base             float64 `json:"base,omitempty"`
}

// WakeupCreated is the answer to a created wake-up (201).
type WakeupCreated struct {
	ID      string  `json:"id"`
	Status  string  `json:"status"`
	Outcome *string `json:"outcome"`
}

// Wakeup is a wake-up as the API shows it.
type Wakeup struct {
	ID         string  `json:"id"`
	AgentID    string  `json:"agent_id"`
	WorkflowID string  `json:"workflow_id"`
	RunID      *string `json:"run_id"`
	Signal     string  `json:"signal"`
	Scope      string  `json:"scope"`
	Cost       int64   `json:"cost"`
	Pool       string  `json:"pool"`
	// Status is pending, delivered or failed.
	Status string `json:"status"`
	// Outcome is succeeded, failed, canceled or denied once settled.
	Outcome *string         `json:"outcome"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   string          `json:"error,omitempty"`
	// Approval is the overrun approval request of a refused spend.
	Approval *WakeupApproval `json:"approval"`
	Delivery Delivery        `json:"delivery"`
	WorkID   *string         `json:"work_id"`

	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// WakeupApproval names a wake-up's approval request and its state.
type WakeupApproval struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// Delivery is the state of a signal to a workflow: waiting, queued, sent
// or undeliverable.
type Delivery struct {
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// WakeupListParams filter GET /v1/wakeups.
type WakeupListParams struct {
	WorkflowID string
	AgentID    string
	// Status is pending, delivered or failed.
	Status string
	// Delivery is the signal's delivery state: waiting, queued, sent or
	// undeliverable.
	Delivery string
	PageParams
}

// Create asks for a wake-up. A refused spend is an *Error with status 402
// whose ApprovalID and WakeupID name the approval request and the intent
// (IsSpendRefused). The call carries an Idempotency-Key, so its retries
// never spend twice.
func (s *WakeupsService) Create(ctx context.Context, req WakeupRequest, opts ...CallOption) (WakeupCreated, error) {
	return doJSON[WakeupCreated](ctx, s.c, endpoint{method: http.MethodPost, path: "/v1/wakeups", safety: keyed}, req, opts)
}

// Get returns a wake-up.
func (s *WakeupsService) Get(ctx context.Context, id string, opts ...CallOption) (Wakeup, error) {
	return doJSON[Wakeup](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "wakeups", id), argErr: needArgs("Wakeups.Get", "id", id)}, nil, opts)
}

// List iterates over the wake-ups, newest first.
func (s *WakeupsService) List(ctx context.Context, p WakeupListParams, opts ...CallOption) iter.Seq2[Wakeup, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[Wakeup], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.ListPage(ctx, p, opts...)
	})
}

// ListPage returns one page of the wake-ups, newest first.
func (s *WakeupsService) ListPage(ctx context.Context, p WakeupListParams, opts ...CallOption) (Page[Wakeup], error) {
	q := url.Values{}
	setIf(q, "workflow_id", p.WorkflowID)
	setIf(q, "agent_id", p.AgentID)
	setIf(q, "status", p.Status)
	setIf(q, "delivery", p.Delivery)
	ep := endpoint{method: http.MethodGet, path: "/v1/wakeups", query: p.addTo(q)}
	return doJSON[Page[Wakeup]](ctx, s.c, ep, nil, opts)
}

// Cancel cancels a wake-up's work or pending approval request; a settled
// wake-up is left as it is.
func (s *WakeupsService) Cancel(ctx context.Context, id string, opts ...CallOption) (Wakeup, error) {
	return doJSON[Wakeup](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "wakeups", id, "cancel"), argErr: needArgs("Wakeups.Cancel", "id", id)}, nil, opts)
}

// Redeliver queues an undeliverable wake signal again (409 when it is not
// undeliverable). Not retried: a second attempt would meet the first's
// effect as a 409.
func (s *WakeupsService) Redeliver(ctx context.Context, id string, opts ...CallOption) (Wakeup, error) {
	return doJSON[Wakeup](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "wakeups", id, "redeliver"), safety: unsafe, argErr: needArgs("Wakeups.Redeliver", "id", id)}, nil, opts)
}

package client

import (
	"context"
	"encoding/json"
	"iter"
	"net/http"
	"time"
)

// PoolsService calls the pool routes (/v1/pools): their settings and
// status, and plain work.
type PoolsService struct{ c *Client }

// Pool is a work pool: its settings, its loop and the caller's org's
// counts.
type Pool struct {
	Name                 string `json:"name"`
	MaxParallelism       int    `json:"max_parallelism"`
	MaxParallelismPerOrg *int   `json:"max_parallelism_per_org"`
	// Paused: the pool accepts work but starts none (Pause, Resume).
	Paused    bool      `json:"paused"`
	RunStatus RunStatus `json:"run_status"`
	// Running and Pending count the caller's org's items; BlockedByKey and
	// BlockedByOrgCap its ready items a concurrency key or the per-org cap
	// holds back.
	Running           int64   `json:"running"`
	Pending           int64   `json:"pending"`
	BlockedByKey      int64   `json:"blocked_by_key"`
	BlockedByOrgCap   int64   `json:"blocked_by_org_cap"`
	OldestPendingAgeS float64 `json:"oldest_pending_age_s"`
	// Weight is the caller's org's fair-share weight; OrgWeights, in the
	// operator routes' answers only, every org's that is not the default
	// (empty, not nil, when every org has the default).
	Weight     int            `json:"weight"`
	OrgWeights map[string]int `json:"org_weights,omitempty"`
	Report     PoolReport     `json:"report"`
}

// RunStatus is the state of a pool's main loop: for an operator, as the
// loop publishes it; for any other caller, as the loop would publish it
// were the caller's org's work all the pool holds (another org's work is
// absent data).
type RunStatus struct {
	// Kind is running, scheduled or idle.
	Kind      string     `json:"kind"`
	Saturated *bool      `json:"saturated,omitempty"`
	At        *time.Time `json:"at,omitempty"`
}

// PoolReport counts the caller's org's finished work still retained.
type PoolReport struct {
	Completed int64 `json:"completed"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Canceled  int64 `json:"canceled"`
	Retries   int64 `json:"retries"`
}

// PoolUpdate is the body of PATCH /v1/pools/{pool}: absent fields are
// kept; MaxParallelismPerOrg: Null removes the per-org cap.
type PoolUpdate struct {
	MaxParallelism       *int          `json:"max_parallelism,omitempty"`
	MaxParallelismPerOrg Nullable[int] `json:"max_parallelism_per_org,omitzero"`
	// OrgWeights sets fair-share weights by org (a nil value gives that org
	// the default again); Null[map…]() gives every org the default.
	OrgWeights Nullable[map[string]*int] `json:"org_weights,omitzero"`
}

// WorkRequest is the body of POST /v1/pools/{pool}/work.
type WorkRequest struct {
	// Handler is a registered handler, e.g. "http".
	Handler string `json:"handler"`
	// Args is the handler's JSON input (any value that marshals to JSON).
	Args any `json:"args,omitempty"`
	// RunAt delays the work (default now).
	RunAt *time.Time   `json:"run_at,omitempty"`
	Retry *RetryConfig `json:"retry,omitempty"`
	// TimeoutMS bounds each attempt (default 10 minutes).
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// ConcurrencyKey groups the org's work: at most KeyLimit items of one
	// key run at a time, in run_at order (KeyLimit 0: the server's 1).
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	KeyLimit       int    `json:"key_limit,omitempty"`
}

// Work is a work item.
type Work struct {
	ID      string `json:"id"`
	Pool    string `json:"pool"`
	Handler string `json:"handler"`
	// State is pending, running or finished.
	State            string `json:"state"`
	PreviousAttempts int    `json:"previous_attempts"`
	// Outcome is succeeded, failed or canceled once finished.
	Outcome    *string         `json:"outcome,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      *string         `json:"error,omitempty"`
	Attempts   *int            `json:"attempts,omitempty"`
	RunAt      time.Time       `json:"run_at"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	// ConcurrencyKey and KeyLimit are set when the work was enqueued with
	// a key.
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	KeyLimit       int    `json:"key_limit,omitempty"`
}

// List iterates over the pools.
func (s *PoolsService) List(ctx context.Context, opts ...CallOption) iter.Seq2[Pool, error] {
	return all(ctx, "", func(ctx context.Context, cursor string) (Page[Pool], error) {
		return s.ListPage(ctx, PageParams{Cursor: cursor}, opts...)
	})
}

// ListPage returns one page of the pools (today, all of them).
func (s *PoolsService) ListPage(ctx context.Context, p PageParams, opts ...CallOption) (Page[Pool], error) {
	return doJSON[Page[Pool]](ctx, s.c, endpoint{method: http.MethodGet, path: "/v1/pools", query: p.addTo(nil)}, nil, opts)
}

// Get returns a pool.
func (s *PoolsService) Get(ctx context.Context, pool string, opts ...CallOption) (Pool, error) {
	return doJSON[Pool](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "pools", pool), argErr: needArgs("Pools.Get", "pool", pool)}, nil, opts)
}

// Update changes a pool's limits live, all fields or none.
func (s *PoolsService) Update(ctx context.Context, pool string, req PoolUpdate, opts ...CallOption) (Pool, error) {
	return doJSON[Pool](ctx, s.c, endpoint{method: http.MethodPatch, path: pathOf("v1", "pools", pool), argErr: needArgs("Pools.Update", "pool", pool)}, req, opts)
}

// Pause stops the pool from starting work (it still accepts it); running
// work finishes. Pausing a paused pool changes nothing.
func (s *PoolsService) Pause(ctx context.Context, pool string, opts ...CallOption) (Pool, error) {
	return doJSON[Pool](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "pools", pool, "pause"), safety: safe, argErr: needArgs("Pools.Pause", "pool", pool)}, nil, opts)
}

// Resume lets a paused pool start work again, at once.
func (s *PoolsService) Resume(ctx context.Context, pool string, opts ...CallOption) (Pool, error) {
	return doJSON[Pool](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "pools", pool, "resume"), safety: safe, argErr: needArgs("Pools.Resume", "pool", pool)}, nil, opts)
}

// Enqueue adds plain work to a pool (not the wakeup pool: use
// Wakeups.Create). The call carries an Idempotency-Key, which the pool
// keeps too, so its retries enqueue once.
func (s *PoolsService) Enqueue(ctx context.Context, pool string, req WorkRequest, opts ...CallOption) (Work, error) {
	return doJSON[Work](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "pools", pool, "work"), safety: keyed, argErr: needArgs("Pools.Enqueue", "pool", pool)}, req, opts)
}

// WorkService calls the work item routes (/v1/work).
type WorkService struct{ c *Client }

// Get returns a work item.
func (s *WorkService) Get(ctx context.Context, id string, opts ...CallOption) (Work, error) {
	return doJSON[Work](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "work", id), argErr: needArgs("Work.Get", "id", id)}, nil, opts)
}

// Cancel asks for a work item to be canceled and returns it as it stands
// (the cancelation completes moments later).
func (s *WorkService) Cancel(ctx context.Context, id string, opts ...CallOption) (Work, error) {
	return doJSON[Work](ctx, s.c, endpoint{method: http.MethodPost, path: pathOf("v1", "work", id, "cancel"), safety: keyed, repeatable: true, argErr: needArgs("Work.Cancel", "id", id)}, nil, opts)
}

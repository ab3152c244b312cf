package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/workflows/signals"
)

// ErrNotFound is returned for work or a pool that does not exist for the
// caller's org (another org's work is reported the same way).
var ErrNotFound = fmt.Errorf("work %w", apperr.ErrNotFound)

// ErrPoolNotFound is returned by the pool admin calls for an unknown pool.
var ErrPoolNotFound = fmt.Errorf("pool %w", apperr.ErrNotFound)

// ErrIdempotencyKeyReused is returned when an enqueue repeats an
// idempotency key that named a different request.
var ErrIdempotencyKeyReused = fmt.Errorf("%w: this idempotency key was used for a different work request", apperr.ErrConflict)

// errGenerationMismatch means another main loop iteration ran since this
// loop's last one: this loop is stale and must write nothing.
var errGenerationMismatch = errors.New("generation mismatch")

// Querier is what both pgx.Tx and *pgxpool.Pool offer: calls that accept it
// run inside the caller's transaction or on their own.
type Querier = db.Querier

// Handler runs one attempt of a work item. Its ctx is canceled when the work
// is canceled, when the attempt exceeds its timeout, and when the executor
// stops. It returns the JSON result (nil means null) or an error: errors are
// retried per the work's retry policy unless wrapped with NonRetryable.
type Handler func(ctx context.Context, job Job) (json.RawMessage, error)

// Job is what a handler gets to work on.
type Job struct {
	ID      uuid.UUID
	OrgID   string
	Pool    string
	Handler string
	Args    json.RawMessage
	// Attempt numbers attempts from 1.
	Attempt int
}

// NonRetryable marks a handler error as final: the work fails without
// further attempts whatever its retry policy says.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRetryableError{err: err}
}

type nonRetryableError struct{ err error }

func (e *nonRetryableError) Error() string { return e.err.Error() }
func (e *nonRetryableError) Unwrap() error { return e.err }

// IsNonRetryable reports whether err was marked with NonRetryable.
func IsNonRetryable(err error) bool {
	var nr *nonRetryableError
	return errors.As(err, &nr)
}

// Hook is an onComplete hook: it runs inside the transaction that finishes
// the work (tx is a savepoint of it), exactly once per work item, for
// success, failure and cancelation alike. If it returns an error its writes
// are rolled back, the completion still commits, and the loop retries the
// call with backoff until it succeeds.
type Hook func(ctx context.Context, tx pgx.Tx, c Completion) error

// Completion is what a hook learns about finished work.
type Completion struct {
	WorkID  uuid.UUID
	OrgID   string
	Pool    string
	Handler string
	Outcome Outcome
	// Result is the handler's result on success.
	Result json.RawMessage
	// Error is the last attempt's error on failure.
	Error string
	// Attempts is the number of attempts made (0 when canceled before start).
	Attempts int
	// Context is the OnComplete.Context given at enqueue.
	Context json.RawMessage
}

// Outcome is how finished work ended. Its vocabulary is the one the wake
// signal carries to workflows (workflows/signals, the leaf package of the
// outcome and decision words), so a work outcome reaches a workflow as is.
type Outcome string

// Outcomes.
const (
	OutcomeSucceeded Outcome = signals.OutcomeSucceeded
	OutcomeFailed    Outcome = signals.OutcomeFailed
	OutcomeCanceled  Outcome = signals.OutcomeCanceled
)

// RetryPolicy says how often failed work is attempted: MaxAttempts counts
// every attempt, the first included; the wait before attempt n+1 is
// InitialBackoffMS·Base^(n−1), scaled by a random factor in [0.5, 1.5), and
// never more than MaxRetryDelay (24 h). A zero Base means 2.
type RetryPolicy struct {
	MaxAttempts      int     `json:"max_attempts"`
	InitialBackoffMS int     `json:"initial_backoff_ms"`
	Base             float64 `json:"base"`
}

// OnComplete names the hook that runs when the work finishes and the
// context handed to it.
type OnComplete struct {
	Hook    string
	Context json.RawMessage
}

// EnqueueParams describe one work item.
type EnqueueParams struct {
	OrgID   string
	Pool    string
	Handler string
	// Args is the handler's JSON input (nil means {}).
	Args json.RawMessage
	// RunAt delays the first attempt (zero: now, unless RunAtSet).
	RunAt time.Time
	// RunAtSet makes a zero RunAt (0001-01-01T00:00:00Z) the time given,
	// not "now": a client that sent that instant meant it.
	RunAtSet bool
	// Retry is nil for a single attempt.
	Retry *RetryPolicy
	// TimeoutMS bounds each attempt (0: 600,000).
	TimeoutMS int
	// OnComplete is optional.
	OnComplete *OnComplete
	// ConcurrencyKey, when set (at most 200 characters), limits running
	// work of this org with the same key to KeyLimit (1–10,000; 0 means 1:
	// serial, in run_at order). When a key's pending items carry different
	// limits, the limit of its earliest ready item (by run_at) applies.
	ConcurrencyKey string
	KeyLimit       int
	// IdempotencyKey, when set, makes the enqueue happen at most once per
	// (org, pool, key) for at least IdempotencyRetention, even when the
	// work record is purged sooner: a repeat of the same request returns
	// the first one's work id and enqueues nothing; a different request
	// under the key is ErrIdempotencyKeyReused. At most 255 bytes.
	IdempotencyKey string
	// BypassPendingCap counts the item toward its org's pending cap but
	// never refuses it: for work already owed, such as a wake-up whose
	// spend committed (its caller checked the cap with CheckPending first).
	BypassPendingCap bool
	// SkipArgsCheck enqueues the item without its handler's ArgsCheck: for
	// work the system enqueues on its own behalf inside another change's
	// transaction (an approval's webhook deliveries), which a refusal
	// would roll back. The handler still refuses such work when it runs.
	SkipArgsCheck bool
}

// State is the coarse state of a work item as callers see it.
type State string

// States.
const (
	StatePending  State = "pending"
	StateRunning  State = "running"
	StateFinished State = "finished"
)

// Status describes a work item. PreviousAttempts counts attempts already
// made; for finished work Attempts is the total and Outcome, Result or
// Error and FinishedAt are set.
type Status struct {
	ID               uuid.UUID
	OrgID            string
	Pool             string
	Handler          string
	State            State
	PreviousAttempts int
	Canceled         bool
	Outcome          Outcome
	Result           json.RawMessage
	Error            string
	Attempts         int
	RunAt            time.Time
	CreatedAt        time.Time
	FinishedAt       *time.Time
	// ConcurrencyKey and KeyLimit, when the work was enqueued with a key
	// ("" and 0 otherwise).
	ConcurrencyKey string
	KeyLimit       int
}

// RunStatus is a pool main loop's published state: "running" while it
// iterates (and for a short cooldown after), "scheduled" when only future
// work or running jobs remain (Saturated when all slots are taken; At is
// its next timed wake-up), "idle" when nothing remains.
type RunStatus struct {
	Kind      string
	Saturated bool
	At        *time.Time
}

// Report counts a pool's finished work for one org over the retention
// window.
type Report struct {
	Completed int64 `json:"completed"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Canceled  int64 `json:"canceled"`
	Retries   int64 `json:"retries"`
}

// PoolInfo describes a pool; the counts and the weight are for one org.
type PoolInfo struct {
	Name                 string
	MaxParallelism       int
	MaxParallelismPerOrg *int
	// Paused: the pool accepts work but starts none (Manager.Pause).
	Paused bool
	// RunStatus is the status the pool's loop would publish were the org's
	// work all the pool holds (another org's is absent data); LoopStatus
	// is what the loop publishes, of every org's work, for operators.
	RunStatus, LoopStatus RunStatus
	// Running counts the org's running attempts; Pending its items waiting
	// to start, ready or not.
	Running, Pending int64
	// BlockedByKey counts the org's ready items that their concurrency key
	// holds back: per key, those beyond its room (its limit — the earliest
	// ready item's — less its running items).
	BlockedByKey int64
	// BlockedByOrgCap counts the org's ready items, not held back by a
	// key, that the pool's per-org cap holds back: those beyond the room
	// the cap leaves the org (the cap less its running attempts). 0 without
	// a cap. Neither count includes what waits for a free slot of the pool
	// or for a resume.
	BlockedByOrgCap int64
	// OldestPendingAgeSeconds is how long the org's oldest ready item has
	// waited past its run_at (0: none waits). Seconds, not a Duration: a
	// run_at may be as old as year 0000, past a Duration's ~292 years.
	OldestPendingAgeSeconds float64
	// Weight is the org's fair-share weight (1 unless set).
	Weight int
	Report Report
}

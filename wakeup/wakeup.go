// Package wakeup is the wake-up primitive: a durable intent to run work on
// behalf of an agent and to wake a parked Temporal workflow with the
// outcome. Every wake-up passes the mandate gate first — in its own
// transaction, so a refusal's approval request stands whatever happens next
// — and only funded intents reach the pool. The pool's onComplete hook, the
// approval's resolve hook and cancel all end the same way: the outcome is
// recorded and a signal is queued in the same transaction, so a workflow
// never sleeps forever on work that died or was refused.
package wakeup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workflows/signals"
	"github.com/reveille/reveille/workpool"
)

// Names under which the service registers itself with its neighbours.
const (
	// HookName is the workpool onComplete hook that wakes the workflow.
	HookName = "wakeup"
	// ResolveKind is the mandates payload kind of a wake-up's approval request.
	ResolveKind = "wakeup"
	// Queue is the queue name of wake-up signal messages.
	Queue = "wakeup"
	// DefaultPool is the pool a wake-up's work runs in unless it names one.
	DefaultPool = "wakeup"
)

// Outcomes a workflow is woken with.
const (
	OutcomeSucceeded = signals.OutcomeSucceeded
	OutcomeFailed    = signals.OutcomeFailed
	OutcomeCanceled  = signals.OutcomeCanceled
	OutcomeDenied    = signals.OutcomeDenied
)

// Public statuses (SPEC §5): pending until Temporal accepts the signal.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// Delivery states of the wake-up signal.
const (
	DeliveryWaiting       = "waiting"
	DeliveryQueued        = "queued"
	DeliverySent          = "sent"
	DeliveryUndeliverable = "undeliverable"
)

// Internal intent states.
const (
	stateAwaitingApproval = "awaiting_approval"
	stateFunded           = "funded"
	stateEnqueued         = "enqueued"
	stateResolved         = "resolved"
)

var (
	// ErrNotFound: no such wake-up for this org.
	ErrNotFound = fmt.Errorf("wake-up %w", apperr.ErrNotFound)
	// ErrNotUndeliverable: redeliver applies only to a signal that failed.
	ErrNotUndeliverable = fmt.Errorf("%w: the wake-up's signal is not undeliverable", apperr.ErrConflict)
	// ErrIdempotencyKeyReused: the key named a different wake-up request.
	ErrIdempotencyKeyReused = fmt.Errorf("%w: this idempotency key was used for a different wake-up", apperr.ErrConflict)
)

// RefusedError is returned by Create when the mandate refused the spend:
// the intent and its approval request are committed and the workflow will
// be woken once a human resolves the request. A retry under the same
// idempotency key finds the request as it stands: still pending, or
// settled without approval (the wake-up then resolved — canceled, or
// denied — and its workflow was woken).
type RefusedError struct {
	Wakeup     Wakeup
	ApprovalID uuid.UUID
	// Refusal: no_mandate, revoked, expired or insufficient; on a retry,
	// "pending approval", or RefusalApprovalDenied, …Expired, …Canceled.
	Refusal string
}

// The refusals a retry finds when the approval request was settled without
// approval.
const (
	RefusalApprovalDenied   = "approval denied"
	RefusalApprovalExpired  = "approval expired"
	RefusalApprovalCanceled = "approval canceled"
)

// Settled reports whether the approval request was settled without
// approval (the refusal a retry found; Wakeup.Approval.State says how): no
// workflow waits on it any more.
func (e *RefusedError) Settled() bool {
	switch e.Refusal {
	case RefusalApprovalDenied, RefusalApprovalExpired, RefusalApprovalCanceled:
		return true
	}
	return false
}

func (e *RefusedError) Error() string {
	if e.Settled() {
		return fmt.Sprintf("spend refused: approval request %s for wake-up %s was %s", e.ApprovalID, e.Wakeup.ID, e.Wakeup.Approval.State)
	}
	return fmt.Sprintf("spend refused (%s): approval request %s is pending for wake-up %s", e.Refusal, e.ApprovalID, e.Wakeup.ID)
}

// Work is what the wake-up runs in the pool.
type Work struct {
	Handler   string                `json:"handler"`
	Args      json.RawMessage       `json:"args,omitempty"`
	Retry     *workpool.RetryPolicy `json:"retry,omitempty"`
	TimeoutMS int                   `json:"timeout_ms,omitempty"`
	// ConcurrencyKey and KeyLimit are workpool.EnqueueParams': at most
	// KeyLimit of the org's work with the key runs at a time.
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	KeyLimit       int    `json:"key_limit,omitempty"`
}

// CreateParams request a wake-up.
type CreateParams struct {
	OrgID      string
	AgentID    string
	WorkflowID string // must start with "<org_id>/"
	RunID      string // optional
	Signal     string // the signal name the workflow waits on
	Scope      string
	Reason     string
	Cost       int64
	Work       Work
	Pool       string // default DefaultPool
	// IdempotencyKey makes Create act at most once per (org, agent, key): a repeat
	// returns the same wake-up (one spend, one work item).
	IdempotencyKey string
	// RequestedBy is the caller's token sub (it may not approve its own overrun).
	RequestedBy string
}

// Approval is the state of a wake-up's approval request.
type Approval struct {
	ID    uuid.UUID `json:"id"`
	State string    `json:"state"`
}

// Delivery is the state of a wake-up's signal.
type Delivery struct {
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
}

// Wakeup is a wake-up as callers see it.
type Wakeup struct {
	ID         uuid.UUID
	OrgID      string
	AgentID    string
	WorkflowID string
	RunID      string
	Signal     string
	Scope      string
	Reason     string
	Cost       int64
	Pool       string
	Work       Work
	Status     string // pending | delivered | failed
	Outcome    string // "" until resolved
	Result     json.RawMessage
	Error      string
	Approval   *Approval
	Delivery   Delivery
	WorkID     *uuid.UUID
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Wake is the signal payload a workflow receives (SPEC §5), shared with
// the workflow side through the leaf package signals.
type Wake = signals.Wake

// Config configures the service. Zero values take the defaults noted.
type Config struct {
	// ReconcileInterval is how often the leader looks for funded intents
	// that no transaction enqueued (default 2 s), and ReconcileAfter how old
	// such an intent must be before it is taken (default 5 s), so that the
	// reconciler does not race a request still in its second transaction.
	ReconcileInterval, ReconcileAfter time.Duration
	Logger                            *slog.Logger
	Registry                          prometheus.Registerer
	// Dispatcher, when set, is this process's signal dispatcher: the wake
	// signals of work completed here are handed to it directly after the
	// completing commit instead of being found through NOTIFY and a claim.
	Dispatcher *queue.Dispatcher
	// BeforeEnqueue, when set, runs between the gate and the enqueue
	// transaction; an error aborts Create there, as a crash would. Tests use
	// it to leave a funded intent for the reconciler.
	BeforeEnqueue func(ctx context.Context, id uuid.UUID) error
	// MaxCreateBatch is the most concurrent Create calls one group carries
	// through the gate and the enqueue, each a shared commit (default 32;
	// 1: a group per request).
	MaxCreateBatch int
}

// Service is the wake-up service.
type Service struct {
	db       *pgxpool.Pool
	pool     *workpool.Manager
	mandates *mandates.Service
	cfg      Config
	logger   *slog.Logger
	metrics  *metrics

	creator    *createBatcher
	reconciler leader.Background
}

// New builds the service and registers its workpool hook and its mandates
// resolve hook.
func New(db *pgxpool.Pool, pool *workpool.Manager, m *mandates.Service, cfg Config) *Service {
	cfg.ReconcileInterval = cmp.Or(cfg.ReconcileInterval, 2*time.Second)
	cfg.ReconcileAfter = cmp.Or(cfg.ReconcileAfter, 5*time.Second)
	cfg.MaxCreateBatch = max(cmp.Or(cfg.MaxCreateBatch, 32), 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{db: db, pool: pool, mandates: m, cfg: cfg, logger: cfg.Logger, metrics: newMetrics(cfg.Registry)}
	s.creator = newCreateBatcher(s, cfg.MaxCreateBatch)
	pool.RegisterHook(HookName, s.onWorkComplete)
	m.RegisterResolveHook(ResolveKind, s.onApprovalResolved)
	return s
}

// validate checks a request before anything is spent.
func (s *Service) validate(ctx context.Context, p *CreateParams) error {
	inv := &apperr.InvalidError{}
	checkText(inv, "agent_id", p.AgentID, true)
	checkText(inv, "workflow_id", p.WorkflowID, true)
	checkText(inv, "run_id", p.RunID, false)
	checkText(inv, "signal", p.Signal, true)
	checkText(inv, "scope", p.Scope, true)
	checkText(inv, "reason", p.Reason, false)
	switch {
	case p.WorkflowID == "":
	case signals.OwnsNone(p.OrgID):
		inv.Add("workflow_id", fmt.Sprintf("cannot name a workflow of org %q: %s", p.OrgID, signals.OwnsNoneRule))
	case p.WorkflowID == p.OrgID+"/":
		inv.Add("workflow_id", fmt.Sprintf("needs a workflow name after %q", p.OrgID+"/"))
	case !signals.Owns(p.OrgID, p.WorkflowID):
		inv.Add("workflow_id", fmt.Sprintf("must start with %q: a wake-up may only signal its own org's workflows", p.OrgID+"/"))
	}
	if p.Cost < 0 {
		inv.Add("cost", "must be an integer ≥ 0")
	}
	if p.Pool == "" {
		p.Pool = DefaultPool
	}
	if err := inv.OrNil(); err != nil {
		return err
	}
	err := s.pool.Check(ctx, s.db, s.enqueueParams(p.OrgID, uuid.Nil, p.Pool, p.Work), "work.")
	var workInv *apperr.InvalidError
	if errors.As(err, &workInv) {
		for i, f := range workInv.Fields {
			switch f.Field {
			case "work.pool":
				workInv.Fields[i].Field = "pool"
			case "work.org_id":
				workInv.Fields[i].Field = "org_id"
			}
		}
	}
	return err
}

// maxText bounds the free-text fields of a wake-up.
const maxText = 1000

// checkText rejects empty required fields, over-long text, NUL bytes and
// invalid UTF-8 (which Postgres text cannot hold).
func checkText(inv *apperr.InvalidError, field, v string, required bool) {
	switch {
	case v == "" && required:
		inv.Add(field, "must not be empty")
	case len(v) > maxText:
		inv.Add(field, fmt.Sprintf("must be at most %d bytes", maxText))
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		inv.Add(field, "must be valid UTF-8 without NUL characters")
	}
}

func (s *Service) enqueueParams(orgID string, id uuid.UUID, pool string, w Work) workpool.EnqueueParams {
	hookCtx, _ := json.Marshal(hookContext{OrgID: orgID, WakeupID: id})
	// The pool's cap on pending work was checked at the gate, before the
	// spend: the work of a funded intent is owed, so its enqueue (here, in
	// the approval's transaction or by the reconciler) is never refused.
	return workpool.EnqueueParams{
		OrgID: orgID, Pool: pool, Handler: w.Handler, Args: w.Args, Retry: w.Retry, TimeoutMS: w.TimeoutMS,
		ConcurrencyKey: w.ConcurrencyKey, KeyLimit: w.KeyLimit,
		OnComplete: &workpool.OnComplete{Hook: HookName, Context: hookCtx}, BypassPendingCap: true,
	}
}

type hookContext struct {
	OrgID    string    `json:"org_id"`
	WakeupID uuid.UUID `json:"wakeup_id"`
}

type resolveData struct {
	WakeupID uuid.UUID `json:"wakeup_id"`
}

// Create runs the wake-up protocol: validate; transaction 1, the gate (the
// spend and the intent commit together, funded or awaiting approval; an
// org at its pending-work cap in the pool is refused there, before the
// spend, with workpool.ErrTooManyPending); transaction 2, the enqueue. A
// refusal returns *RefusedError after its commit. A failure after the gate
// leaves a funded intent that the reconciler enqueues, so the caller may
// treat Create as done once the gate committed.
//
// Concurrent calls share their transactions (createBatcher): on the common
// path a request costs three round trips, however many share them.
func (s *Service) Create(ctx context.Context, p CreateParams) (Wakeup, error) {
	if err := s.validate(ctx, &p); err != nil {
		return Wakeup{}, err
	}
	return s.settle(ctx, p, s.creator.do(ctx, p))
}

// settle is Create's answer to p from its group's reply.
func (s *Service) settle(ctx context.Context, p CreateParams, r createReply) (Wakeup, error) {
	switch {
	case r.replay:
		return s.replayKey(ctx, p)
	case r.alone:
		return s.createAlone(ctx, p)
	}
	return r.w, r.err
}

// createAlone is Create for one valid request in transactions of its own:
// the way a request goes when its group failed before committing.
func (s *Service) createAlone(ctx context.Context, p CreateParams) (Wakeup, error) {
	id, existing, refusal, err := s.gate(ctx, p)
	if err != nil {
		return Wakeup{}, err
	}
	if existing {
		return s.replay(ctx, p, id)
	}
	w, err := s.Get(ctx, p.OrgID, AnyAgent, id)
	if err != nil {
		return Wakeup{}, err
	}
	if w.Approval != nil {
		s.metrics.created.WithLabelValues("refused").Inc()
		s.logRefused(ctx, p.OrgID, id, w.Approval.ID, refusal)
		return w, &RefusedError{Wakeup: w, ApprovalID: w.Approval.ID, Refusal: refusal}
	}
	s.metrics.created.WithLabelValues("funded").Inc()
	s.logger.DebugContext(ctx, "wake-up created, funded", "org_id", p.OrgID, "wakeup_id", id, "workflow_id", p.WorkflowID)
	if s.cfg.BeforeEnqueue != nil {
		if err := s.cfg.BeforeEnqueue(ctx, id); err != nil {
			return w, fmt.Errorf("wake-up %s is funded; its work will be enqueued by the reconciler: %w", id, err)
		}
	}
	r := s.enqueueAlone(ctx, p.OrgID, id, w)
	return r.w, r.err
}

// replayKey answers a request whose idempotency key names a committed
// wake-up (found by its group's insert). Should that wake-up be gone — it
// was a request of the same group, refused before its spend — the request
// goes alone.
func (s *Service) replayKey(ctx context.Context, p CreateParams) (Wakeup, error) {
	w, err := s.getByKey(ctx, p.OrgID, p.AgentID, p.IdempotencyKey)
	if errors.Is(err, ErrNotFound) {
		return s.createAlone(ctx, p)
	}
	if err != nil {
		return Wakeup{}, err
	}
	return s.replayOf(w, p)
}

// replay answers a repeated idempotency key with the first request's
// wake-up (a refusal again as *RefusedError).
func (s *Service) replay(ctx context.Context, p CreateParams, id uuid.UUID) (Wakeup, error) {
	w, err := s.Get(ctx, p.OrgID, AnyAgent, id)
	if err != nil {
		return Wakeup{}, err
	}
	return s.replayOf(w, p)
}

// replayOf answers p, whose idempotency key named w.
func (s *Service) replayOf(w Wakeup, p CreateParams) (Wakeup, error) {
	if !sameRequest(w, p) {
		return Wakeup{}, ErrIdempotencyKeyReused
	}
	// (the request as it stands now: an approval settled without approval
	// is still a refusal, never a wake-up that will run)
	if w.Approval != nil && w.Approval.State != mandates.StateApproved {
		refusal := "approval " + w.Approval.State
		if w.Approval.State == mandates.StatePending {
			refusal = "pending approval"
		}
		return w, &RefusedError{Wakeup: w, ApprovalID: w.Approval.ID, Refusal: refusal}
	}
	return w, nil
}

// sameRequest reports whether p asks for the wake-up w records.
func sameRequest(w Wakeup, p CreateParams) bool {
	return w.AgentID == p.AgentID && w.WorkflowID == p.WorkflowID && w.RunID == p.RunID && w.Signal == p.Signal &&
		w.Scope == p.Scope && w.Reason == p.Reason && w.Cost == p.Cost && w.Pool == p.Pool &&
		w.Work.Handler == p.Work.Handler && w.Work.TimeoutMS == p.Work.TimeoutMS &&
		w.Work.ConcurrencyKey == p.Work.ConcurrencyKey && w.Work.KeyLimit == p.Work.KeyLimit &&
		jsonb.Equal(workArgs(w.Work.Args), workArgs(p.Work.Args)) && jsonb.Equal(mustMarshal(w.Work.Retry), mustMarshal(p.Work.Retry))
}

// workArgs is what the handler gets for args: absent is {} (as the pool
// enqueues it), unlike null — compared as given, jsonb.Equal took absent
// for null and replayed one request's wake-up to the other.
func workArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return json.RawMessage("{}")
	}
	return args
}

func mustMarshal(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// gate is transaction 1: insert the intent and decide the spend together.
// existing reports that the idempotency key named an earlier wake-up;
// refusal says why a refused spend was refused.
func (s *Service) gate(ctx context.Context, p CreateParams) (id uuid.UUID, existing bool, refusal string, err error) {
	id, err = uuid.NewV7()
	if err != nil {
		return uuid.Nil, false, "", err
	}
	var spent *mandates.SpendResult // the decision made, counted once committed
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		work, err := json.Marshal(p.Work)
		if err != nil {
			return err
		}
		var key *string
		if p.IdempotencyKey != "" {
			key = &p.IdempotencyKey
		}
		// A concurrent duplicate's insert waits here for the first to commit,
		// then finds its row.
		tag, err := tx.Exec(ctx, `
			INSERT INTO wakeups (id, org_id, agent_id, workflow_id, run_id, signal, scope, reason, cost, pool, work, state, idempotency_key, created_by)
			VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11, 'funded', $12, $13)
			ON CONFLICT (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING`,
			id, p.OrgID, p.AgentID, p.WorkflowID, p.RunID, p.Signal, p.Scope, p.Reason, p.Cost, p.Pool, work, key, p.RequestedBy)
		if err != nil {
			return fmt.Errorf("insert wake-up: %w", err)
		}
		if tag.RowsAffected() == 0 {
			existing = true
			return tx.QueryRow(ctx, `SELECT id FROM wakeups WHERE org_id = $1 AND agent_id = $2 AND idempotency_key = $3`, p.OrgID, p.AgentID, p.IdempotencyKey).Scan(&id)
		}
		// An org at its cap of pending work in the pool is refused before
		// anything is spent: the intent rolls back with this transaction.
		if err := s.pool.CheckPending(ctx, tx, p.OrgID, p.Pool); err != nil {
			return err
		}
		data, _ := json.Marshal(resolveData{WakeupID: id})
		res, decided, err := s.mandates.SpendTx(ctx, tx, mandates.SpendParams{
			OrgID: p.OrgID, AgentID: p.AgentID, Scope: p.Scope, Cost: p.Cost, Reason: p.Reason,
			IdempotencyKey: "wakeup:" + id.String(), RequestedBy: p.RequestedBy,
			OnResolve: &mandates.Payload{Kind: ResolveKind, Data: data},
		})
		if err != nil {
			return fmt.Errorf("spend for wake-up: %w", err)
		}
		if decided {
			spent = &res
		}
		if !res.OK {
			refusal = res.Refusal
			_, err = tx.Exec(ctx, `UPDATE wakeups SET state = 'awaiting_approval', approval_id = $2 WHERE id = $1 AND org_id = $3`, id, res.ApprovalID, p.OrgID)
			return err
		}
		return nil
	})
	if err == nil && spent != nil {
		s.mandates.CountSpend(*spent)
	}
	return id, existing, refusal, err
}

// enqueueFunded is transaction 2: enqueue a funded intent's work and mark it
// enqueued. It reports false when the intent was no longer funded (another
// transaction got there first, or it was canceled).
func (s *Service) enqueueFunded(ctx context.Context, orgID string, id uuid.UUID) (bool, error) {
	var done bool
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		done, err = s.enqueueFundedTx(ctx, tx, orgID, id, false)
		return err
	})
	return done, err
}

// enqueueFundedTx enqueues the intent's work in tx if it is funded (locking
// the row; skipLocked makes a busy row someone else's business).
func (s *Service) enqueueFundedTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, skipLocked bool) (bool, error) {
	lock := "FOR UPDATE"
	if skipLocked {
		lock = "FOR UPDATE SKIP LOCKED"
	}
	var pool string
	var work Work
	err := tx.QueryRow(ctx, `SELECT pool, work FROM wakeups WHERE org_id = $1 AND id = $2 AND state = 'funded' `+lock, orgID, id).Scan(&pool, &work)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock funded wake-up: %w", err)
	}
	workID, err := s.pool.EnqueueTx(ctx, tx, s.enqueueParams(orgID, id, pool, work))
	if err != nil {
		return false, fmt.Errorf("enqueue wake-up work: %w", err)
	}
	_, err = tx.Exec(ctx, `UPDATE wakeups SET state = 'enqueued', work_id = $3, updated_at = now() WHERE org_id = $1 AND id = $2`, orgID, id, workID)
	return err == nil, err
}

// resolveTx records an intent's outcome and queues its signal, once: a
// wake-up that is already resolved is left alone (false).
func (s *Service) resolveTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, outcome string, result json.RawMessage, errText string) (bool, error) {
	var workflowID, signal string
	var runID *string
	err := tx.QueryRow(ctx, `
		UPDATE wakeups SET state = 'resolved', outcome = $3, result = $4, error = NULLIF($5, ''), updated_at = now()
		 WHERE org_id = $1 AND id = $2 AND state <> 'resolved'
		RETURNING workflow_id, run_id, signal`, orgID, id, outcome, nullJSON(result), errText).Scan(&workflowID, &runID, &signal)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("record wake-up outcome: %w", err)
	}
	payload, err := json.Marshal(Wake{OrgID: orgID, WakeupID: id.String(), Outcome: outcome, Result: nullJSON(result), Error: errText})
	if err != nil {
		return false, err
	}
	sig := &queueSignal{WorkflowID: workflowID, Name: signal}
	if runID != nil {
		sig.RunID = *runID
	}
	if err := s.enqueueSignal(ctx, tx, orgID, id, payload, sig); err != nil {
		return false, err
	}
	// Counted once the transaction commits — the pool's completing one, a
	// mandate resolution's or a cancel's (their ctx carries the collector):
	// one rolled back resolved nothing, and is run again; elsewhere (a
	// reconciler's), at once.
	db.CountAfterCommit(ctx, func() { s.metrics.resolved.WithLabelValues(outcome).Inc() })
	// In the resolving transaction: the signal is queued when it commits.
	s.logger.DebugContext(ctx, "wake-up resolved, signal queued", "org_id", orgID, "wakeup_id", id, "outcome", outcome, "workflow_id", workflowID)
	return true, nil
}

// logRefused is the debug line of a wake-up whose spend was refused.
func (s *Service) logRefused(ctx context.Context, orgID string, id, approvalID uuid.UUID, refusal string) {
	s.logger.DebugContext(ctx, "wake-up created, spend refused: awaiting approval", "org_id", orgID, "wakeup_id", id,
		"approval_id", approvalID, "refusal", refusal)
}

func nullJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return b
}

// ReconcilerLeadership names the reconciler's leadership (internal/leader).
const ReconcilerLeadership = "wakeup.reconciler"

// Start runs the leader-only reconciler until Stop. It returns at once, and
// starts once.
func (s *Service) Start(ctx context.Context) error {
	elector := &leader.Elector{DB: s.db, Name: ReconcilerLeadership, Logger: s.logger, Retry: s.cfg.ReconcileInterval}
	return s.reconciler.Start(ctx, elector, leader.Every(s.cfg.ReconcileInterval, s.reconcileRound, func(err error) {
		s.metrics.reconcileErrs.Inc()
		s.logger.Error("reconciling funded wake-ups failed", "error", err)
	}))
}

// Stop stops the reconciler and waits for it and for the groups of
// requests under way (until ctx ends: then it cancels the groups still
// running); stopping twice is safe.
func (s *Service) Stop(ctx context.Context) error {
	err := s.reconciler.Stop(ctx)
	if s.creator != nil {
		err = errors.Join(err, s.creator.drains.Wait(ctx))
	}
	return err
}

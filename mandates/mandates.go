// Package mandates is Reveille's spending authority: per (org, agent, scope)
// a budget an agent may spend without asking, a ledger of every change, and
// approval requests for a human when a spend is refused.
//
// A spend is decided by one conditional statement, never read-then-write, so
// no interleaving of spenders can overspend. A refusal commits its approval
// request with the decision: Spend runs in its own transaction precisely so
// that a caller failing afterwards cannot roll the request back (SpendTx is
// for callers whose own rows must commit with the decision). Resolving a
// request (approve, deny, expiry) calls the resolve hook registered for the
// request's payload kind inside the resolving transaction.
package mandates

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/page"
)

// Mandate statuses.
const (
	StatusActive  = "active"
	StatusRevoked = "revoked"
)

// Approval request states.
const (
	StatePending  = "pending"
	StateApproved = "approved"
	StateDenied   = "denied"
	StateExpired  = "expired"
	StateCanceled = "canceled"
)

// Ledger entry kinds.
const (
	KindDebit           = "debit"
	KindRefund          = "refund"
	KindApprovedOverrun = "approved_overrun"
)

// Refusal reasons reported with a refused spend.
const (
	RefusalNoMandate    = "no_mandate"
	RefusalRevoked      = "revoked"
	RefusalExpired      = "expired"
	RefusalInsufficient = "insufficient"
)

// AnyAgent, as the agentID of a lookup, matches every agent of the org (a
// caller not bound to one agent).
const AnyAgent = ""

// Errors. Each wraps an apperr kind, which the HTTP layer maps to a status.
var (
	// ErrNotFound: no such mandate for this org (another org's is absent too).
	ErrNotFound = fmt.Errorf("mandate %w", apperr.ErrNotFound)
	// ErrApprovalNotFound: no such approval request for this org.
	ErrApprovalNotFound = fmt.Errorf("mandate approval request %w", apperr.ErrNotFound)
	// ErrExists: a mandate for this (agent, scope) already exists.
	ErrExists = fmt.Errorf("%w: a mandate for this agent and scope already exists", apperr.ErrConflict)
	// ErrAlreadyResolved: the request is no longer pending.
	ErrAlreadyResolved = fmt.Errorf("%w: the approval request is already resolved", apperr.ErrConflict)
	// ErrSelfApproval: the resolver is the principal that asked.
	ErrSelfApproval = fmt.Errorf("%w: an approval request cannot be resolved by the principal that created it", apperr.ErrForbidden)
	// ErrSpentBeyondMax: approving the request would take its mandate's
	// spent past MaxAmount. Nothing is charged and the request stays pending:
	// it can still be denied (or left to expire).
	ErrSpentBeyondMax = fmt.Errorf("%w: approving this request would take the mandate's spent past 2^53−1, the largest amount the API carries; deny it instead", apperr.ErrConflict)
	// ErrIdempotencyKeyReused: the key was first used for a different spend
	// (agent, scope or cost).
	ErrIdempotencyKeyReused = fmt.Errorf("%w: this idempotency key was used for a different spend", apperr.ErrConflict)
	// ErrNoHook: a request's payload kind has no registered resolve hook, so
	// resolving it would leave its caller uninformed.
	ErrNoHook = fmt.Errorf("mandates: no resolve hook registered for the payload kind")
)

// Config configures the service. Zero values take the defaults noted.
type Config struct {
	// ApprovalTTL is how long an approval request stays pending before it
	// expires (REVEILLE_APPROVAL_TTL; default 24 h).
	ApprovalTTL time.Duration
	// SweepInterval is how often the leader expires pending requests past
	// their expires_at (default 5 s).
	SweepInterval time.Duration
	// MaxSpendBatch is the most concurrent Spend calls one commit carries
	// (default 64; 1 commits every spend on its own).
	MaxSpendBatch int
	// LeaderRetry is how often a standby tries to become the sweeper's
	// leader (default: the elector's, 2 s).
	LeaderRetry time.Duration
	// Inbox, when set, receives an event for every change of a request's
	// state, in the transaction that makes it (package inbox).
	Inbox *inbox.Log
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default: none registered).
	Registry prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.ApprovalTTL = cmp.Or(c.ApprovalTTL, 24*time.Hour)
	c.SweepInterval = cmp.Or(c.SweepInterval, 5*time.Second)
	c.MaxSpendBatch = cmp.Or(c.MaxSpendBatch, 64)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Service is the mandates domain service.
type Service struct {
	db      *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	metrics *metrics
	batcher *spendBatcher // nil: every Spend commits alone

	hooksMu sync.RWMutex
	hooks   map[string]ResolveHook

	sweeper leader.Background
}

// New returns the service. It registers its metrics on cfg.Registry.
func New(db *pgxpool.Pool, cfg Config) *Service {
	cfg = cfg.withDefaults()
	s := &Service{db: db, cfg: cfg, logger: cfg.Logger, metrics: newMetrics(cfg.Registry), hooks: map[string]ResolveHook{}}
	if cfg.MaxSpendBatch > 1 {
		s.batcher = newSpendBatcher(s, cfg.MaxSpendBatch, spendBatchers)
	}
	return s
}

// Mandate is spending authority for (org, agent, scope).
type Mandate struct {
	ID         uuid.UUID
	OrgID      string
	AgentID    string
	Scope      string
	Budget     int64
	Spent      int64
	Status     string
	ValidUntil *time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Remaining is what may still be spent; never negative, although an approved
// overrun can take Spent past Budget.
func (m Mandate) Remaining() int64 { return max(m.Budget-m.Spent, 0) }

// LedgerEntry is one change of a mandate's spent.
type LedgerEntry struct {
	ID             uuid.UUID
	MandateID      uuid.UUID
	Kind           string // debit | refund | approved_overrun
	Amount         int64  // signed: refunds are negative
	Reason         string
	IdempotencyKey string
	ApprovalID     *uuid.UUID // for approved_overrun
	CreatedAt      time.Time
}

// Payload is the opaque, typed data a spender stores with its approval
// request; it comes back to the resolve hook registered for Kind.
type Payload struct {
	Kind string
	Data json.RawMessage
}

// Approval is an overrun approval request.
type Approval struct {
	ID          uuid.UUID
	OrgID       string
	AgentID     string
	Scope       string
	Cost        int64
	Reason      string
	State       string
	RequestedBy string
	// Refusal is why the spend was refused (no_mandate, revoked, expired,
	// insufficient).
	Refusal string
	// Budget and Spent are the mandate's when the spend was refused (nil:
	// there was no mandate, or the request predates their recording).
	Budget     *int64
	Spent      *int64
	OnResolve  *Payload
	ExpiresAt  time.Time
	CreatedAt  time.Time
	ResolvedAt *time.Time
	ResolvedBy string
	Note       string
}

// Page asks for one page of a list (see internal/page).
type Page = page.Page

// MaxLimit is the largest page.
const MaxLimit = page.MaxLimit

// MaxText bounds, in bytes, the text a caller gives: a mandate's and a
// spend's agent, scope, reason and idempotency key, and the note of an
// approval request's resolution (as a wake-up's text and a tool call's
// answer's). The ledger, approval requests, their events and webhooks keep
// it.
const MaxText = 1000

// spendBatchers is how many spend batches may run at once (never two on
// one mandate).
const spendBatchers = 4

func newID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// Package approvals is tool-call gating: an agent asks to call a tool in a
// session; a standing policy answers at once, or the request waits for a
// human, whose answer (or the request's expiry) wakes the workflow that
// asked, through the signal outbox of package queue.
//
// Two axes stay apart, as in the reference's toolApprovals: the decision
// answers this call (these pending calls) only, while a standing policy —
// set by an admin, or by the approver alongside a decision — decides future
// calls. Policies may be conditional (a match object the call's input must
// contain); they decide in SPEC §7's order: a matching never, then a
// matching always, then the unconditional policy, then "once".
//
// Every write to a session takes its row lock first (binding, requests,
// answers, expiry), which numbers the session's events without gaps under
// concurrent writers and gives every transaction the same lock order.
package approvals

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/page"
	"github.com/reveille/reveille/workflows/signals"
)

// Standing policy values.
const (
	PolicyAlways = "always" // approve without asking
	PolicyOnce   = "once"   // ask every time (the default)
	PolicyNever  = "never"  // deny without asking
)

// Tool approval statuses.
const (
	StatusPending  = "pending"
	StatusApproved = "approved"
	StatusDenied   = "denied"
	StatusExpired  = "expired"
)

// Who decided a tool approval.
const (
	SourceHuman   = signals.SourceHuman
	SourcePolicy  = "policy"
	SourceExpired = signals.SourceExpired
)

// Decisions. A request answers pending when neither a policy decides it.
const (
	DecisionApproved = signals.DecisionApproved
	DecisionDenied   = signals.DecisionDenied
	DecisionPending  = "pending"
)

// Session event names.
const (
	EventRequested = "tool.approval.requested"
	EventResolved  = "tool.approval.resolved"
	EventDenied    = "turn.tool_call.denied"
)

// Delivery states of a tool approval's signal (as a wake-up's).
const (
	DeliveryWaiting       = "waiting"
	DeliveryQueued        = "queued"
	DeliverySent          = "sent"
	DeliveryUndeliverable = "undeliverable"
)

// Queue is the queue name of tool approval signal messages; a message's
// idempotency key is its approval's id.
const Queue = "tool_approval"

// Limits on input (bytes).
const (
	MaxToolName = 128
	MaxID       = 255  // session ids
	MaxText     = 1000 // agent ids, workflow ids, run ids, signal names, notes
	MaxInput    = 64 << 10
	// MaxInputNesting bounds how deep an input's arrays and objects nest.
	MaxInputNesting = 1000
	MaxMatch        = 4 << 10
	// MaxMatchArrayElements bounds the array elements of a policy's match,
	// all its arrays together, and MaxConditionalPolicies an agent's tool's
	// policies with a match: every tool call tests each such match against
	// its input (jsonb @>), and an array's test compares each of its
	// elements with each of the input array's (up to 32,000): a 4 KiB match
	// cost a second of the database's time per call, so an org's tool
	// calls could hold the connections every org's requests share.
	MaxMatchArrayElements  = 8
	MaxConditionalPolicies = 20
	// MinExpiresIn and MaxExpiresIn bound a request's expires_in_s.
	MinExpiresIn = 10 * time.Second
	MaxExpiresIn = 7 * 24 * time.Hour
)

// Errors. Each wraps an apperr kind, which the HTTP layer maps to a status.
var (
	// ErrNotFound: no such tool approval for this org (or visible agent).
	ErrNotFound = fmt.Errorf("tool approval %w", apperr.ErrNotFound)
	// ErrSessionNotFound: no such session for this org (or visible agent).
	ErrSessionNotFound = fmt.Errorf("session %w", apperr.ErrNotFound)
	// ErrPolicyNotFound: no such standing policy.
	ErrPolicyNotFound = fmt.Errorf("tool policy %w", apperr.ErrNotFound)
	// ErrTooManyPolicies: one more conditional policy would pass
	// MaxConditionalPolicies for the agent's tool.
	ErrTooManyPolicies = fmt.Errorf("%w: an agent's tool has at most %d policies with a match; delete one first", apperr.ErrConflict, MaxConditionalPolicies)
	// ErrSessionAgent: the session is bound to another agent.
	ErrSessionAgent = fmt.Errorf("%w: the session is bound to another agent", apperr.ErrConflict)
	// ErrAlreadyResolved: the tool approval is no longer pending.
	ErrAlreadyResolved = fmt.Errorf("%w: the tool approval is already resolved", apperr.ErrConflict)
	// ErrNothingPending: an answer found no pending call and sets no policy.
	ErrNothingPending = fmt.Errorf("%w: no pending tool call to answer, and no update_policy given", apperr.ErrConflict)
	// ErrNotUndeliverable: redeliver applies only to a decision whose
	// signal was given up on.
	ErrNotUndeliverable = fmt.Errorf("%w: the tool approval's signal is not undeliverable", apperr.ErrConflict)
	// ErrSelfApproval: the resolver made (one of) the request(s).
	ErrSelfApproval = fmt.Errorf("%w: a tool call cannot be approved or denied by the principal that requested it", apperr.ErrForbidden)
	// ErrNoResolver: an answer without the resolver's identity, which the
	// self-approval rule needs.
	ErrNoResolver = fmt.Errorf("%w: answering a tool call needs the resolver's identity (sub)", apperr.ErrForbidden)
	// ErrIdempotencyKeyReused: the key was first used for a different request.
	ErrIdempotencyKeyReused = fmt.Errorf("%w: this idempotency key was used for a different tool call", apperr.ErrConflict)
)

// Config configures the service. Zero values take the defaults noted.
type Config struct {
	// TTL is how long a pending request waits for a human unless it says
	// otherwise (REVEILLE_TOOL_APPROVAL_TTL; default 1 h).
	TTL time.Duration
	// SweepInterval is how often the leader expires pending requests past
	// their expires_at (default 1 s).
	SweepInterval time.Duration
	// LeaderRetry is how often a standby tries to become the sweeper's
	// leader (default: the elector's, 2 s).
	LeaderRetry time.Duration
	// Inbox, when set, receives an event when a call goes pending for a
	// human and when it is answered or expires, in the transaction that
	// makes the change (package inbox).
	Inbox *inbox.Log
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default: none registered).
	Registry prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.TTL = cmp.Or(c.TTL, time.Hour)
	c.SweepInterval = cmp.Or(c.SweepInterval, time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Service is the tool approvals domain service.
type Service struct {
	db      *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	metrics *metrics

	sweeper leader.Background
}

// New returns the service. It registers its metrics on cfg.Registry.
func New(db *pgxpool.Pool, cfg Config) *Service {
	cfg = cfg.withDefaults()
	return &Service{db: db, cfg: cfg, logger: cfg.Logger, metrics: newMetrics(db, cfg.Registry)}
}

// Policy is a standing policy for (org, agent, tool), conditional when
// Match is set.
type Policy struct {
	ID        uuid.UUID
	AgentID   string
	ToolName  string
	Match     json.RawMessage // nil: unconditional
	Approval  string          // always | once | never
	CreatedAt time.Time
	UpdatedAt time.Time
	UpdatedBy string
}

// Delivery is the state of a tool approval's signal.
type Delivery struct {
	State     string
	Attempts  int
	LastError string
}

// ToolApproval is a tool-call request and its answer.
type ToolApproval struct {
	ID          uuid.UUID
	OrgID       string
	SessionID   string
	AgentID     string
	ToolName    string
	Input       json.RawMessage // nil when the call had none
	Status      string          // pending | approved | denied | expired
	Source      string          // "" while pending; human | policy | expired
	PolicyID    *uuid.UUID      // the deciding policy (source policy)
	RequestedBy string
	ResolvedBy  string
	Note        string
	WorkflowID  string
	RunID       string
	Signal      string
	// Delivery is nil unless a human's answer or expiry has a workflow to
	// signal (a request naming one that did not go to a policy).
	Delivery   *Delivery
	CreatedAt  time.Time
	ExpiresAt  time.Time
	ResolvedAt *time.Time
}

// Decision is the answer a request got: approved or denied (by a policy,
// or later by a human or expiry), or pending.
func (a ToolApproval) Decision() string {
	switch a.Status {
	case StatusApproved:
		return DecisionApproved
	case StatusPending:
		return DecisionPending
	}
	return DecisionDenied
}

// Event is one session event.
type Event struct {
	Seq       int64
	Name      string
	Payload   json.RawMessage
	CreatedAt time.Time
}

// Page asks for one page of a list (see internal/page).
type Page = page.Page

// MaxLimit is the largest page.
const MaxLimit = page.MaxLimit

func newID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Package inbox is the approvals inbox: the per-org event log of approval
// requests and answers, of both kinds (tool calls and mandate overruns),
// that a human's inbox page follows live.
//
// An event is appended in the transaction of the state change it reports
// (Append), so the log never says what did not commit and never misses
// what did. seq numbers an org's events 1, 2, 3… without gaps: the append
// bumps the org's counter row, whose lock orders the org's appends, so
// they commit in seq order and a reader that has seen seq n has seen every
// event before it. A reader resumes after any seq (After); live readers
// wait on a Subscription, fed by one LISTEN connection per process (Hub).
package inbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/leader"
)

// Event types.
const (
	TypeRequested = "requested"
	TypeResolved  = "resolved"
)

// Event kinds: which approval the event is about.
const (
	KindToolCall       = "tool_call"
	KindMandateOverrun = "mandate_overrun"
)

// MaxPage is the most events After returns at once.
const MaxPage = 500

// Event is one entry of an org's log. Its JSON is the data of the SSE
// event (the org is the reader's own, so it is not repeated).
type Event struct {
	OrgID      string    `json:"-"`
	Seq        int64     `json:"seq"`
	Type       string    `json:"type"` // requested | resolved
	Kind       string    `json:"kind"` // tool_call | mandate_overrun
	ApprovalID uuid.UUID `json:"approval_id"`
	// Approval is the approval object exactly as its GET route shows it,
	// as of the event.
	Approval json.RawMessage `json:"approval"`
	At       time.Time       `json:"at"`
}

// Config configures the log. Zero values take the defaults noted.
type Config struct {
	// Retention is how long events are kept (default 7 days); a reader
	// resuming from before what is kept is told to reload (Window).
	Retention time.Duration
	// PruneInterval is how often the leader prunes (default 1 min).
	PruneInterval time.Duration
	// LeaderRetry is how often a standby tries to become the pruner's
	// leader (default: the elector's).
	LeaderRetry time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.Retention = cmp.Or(c.Retention, 7*24*time.Hour)
	c.PruneInterval = cmp.Or(c.PruneInterval, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Log is the approvals event log.
type Log struct {
	db  *pgxpool.Pool
	cfg Config
	hub *Hub

	// OnAppend, when set, runs after each append in the same transaction:
	// what it writes commits with the event, and its error rolls the state
	// change back. Set it before the log is used.
	OnAppend func(ctx context.Context, q db.Querier, ev Event) error

	pruner leader.Background
}

// New returns the log.
func New(pool *pgxpool.Pool, cfg Config) *Log {
	cfg = cfg.withDefaults()
	return &Log{db: pool, cfg: cfg, hub: newHub(pool, cfg.Logger)}
}

// PrunerLeadership names the retention pruner's leadership.
const PrunerLeadership = "inbox.pruner"

// Start starts the hub (it LISTENs before Start returns) and the retention
// pruner (on whichever replica leads it). It starts once.
func (l *Log) Start(ctx context.Context) error {
	if err := l.hub.Start(ctx); err != nil {
		return err
	}
	el := &leader.Elector{DB: l.db, Name: PrunerLeadership, Retry: l.cfg.LeaderRetry, Logger: l.cfg.Logger}
	prune := func(ctx context.Context) error { _, err := l.Prune(ctx, time.Now().Add(-l.cfg.Retention)); return err }
	logFailure := func(err error) { l.cfg.Logger.Warn("pruning approval events failed", "error", err.Error()) }
	if err := l.pruner.Start(ctx, el, leader.Every(l.cfg.PruneInterval, prune, logFailure)); err != nil {
		_ = l.hub.Stop(ctx)
		return err
	}
	return nil
}

// Stop stops the pruner and the hub, which ends every subscription.
// Stopping twice, or without Start, is safe.
func (l *Log) Stop(ctx context.Context) error {
	return errors.Join(l.pruner.Stop(ctx), l.hub.Stop(ctx))
}

// Append appends ev to its org's log in the caller's transaction q and
// returns it with Seq and At filled; OnAppend then runs in the same
// transaction. The org's counter row stays locked until q commits, so keep
// the transaction short after an append. Appending on a pool (outside a
// transaction) is a mistake: the event would commit apart from its change.
func (l *Log) Append(ctx context.Context, q db.Querier, ev Event) (Event, error) {
	if len(ev.Approval) == 0 {
		return Event{}, fmt.Errorf("appending approval event: no approval object for %s %s", ev.Kind, ev.ApprovalID)
	}
	err := q.QueryRow(ctx, qAppend, ev.OrgID, ev.Type, ev.Kind, ev.ApprovalID, []byte(ev.Approval)).Scan(&ev.Seq, &ev.At)
	if err != nil {
		return Event{}, fmt.Errorf("appending approval event: %w", err)
	}
	if l.OnAppend != nil {
		if err := l.OnAppend(ctx, q, ev); err != nil {
			return Event{}, fmt.Errorf("approval event hook: %w", err)
		}
	}
	return ev, nil
}

// Seq is the org's last seq (0 before its first event), read on q. A list
// read after it in a later statement reflects every event up to it.
func (l *Log) Seq(ctx context.Context, q db.Querier, orgID string) (int64, error) {
	var seq int64
	err := q.QueryRow(ctx, qSeq, orgID).Scan(&seq)
	if err != nil {
		return 0, fmt.Errorf("reading the approvals event seq: %w", err)
	}
	return seq, nil
}

// Window is what a reader may resume from: every event after oldest-1 up to
// last is kept. An org without events has oldest = last+1.
func (l *Log) Window(ctx context.Context, orgID string) (oldest, last int64, err error) {
	if err := l.db.QueryRow(ctx, qWindow, orgID).Scan(&oldest, &last); err != nil {
		return 0, 0, fmt.Errorf("reading the approvals event window: %w", err)
	}
	return oldest, last, nil
}

// After returns up to limit (1 … MaxPage) of the org's events after seq
// after, in seq order.
func (l *Log) After(ctx context.Context, orgID string, after int64, limit int) ([]Event, error) {
	limit = min(max(limit, 1), MaxPage)
	rows, err := l.db.Query(ctx, qAfter, orgID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("reading approval events: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		ev := Event{OrgID: orgID}
		var payload []byte
		err := r.Scan(&ev.Seq, &ev.Type, &ev.Kind, &ev.ApprovalID, &payload, &ev.At)
		ev.Approval = payload
		return ev, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading approval events: %w", err)
	}
	return events, nil
}

// Prune deletes events created before cutoff, across orgs (the counters
// stay: seq never restarts), and returns how many it deleted.
func (l *Log) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := l.db.Exec(ctx, qPrune, cutoff)
	if err != nil {
		return 0, fmt.Errorf("pruning approval events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Subscribe registers interest in the org's new events. Subscribe before
// reading, so that nothing committed after the read is missed; Close the
// subscription.
func (l *Log) Subscribe(orgID string) (*Subscription, error) { return l.hub.Subscribe(orgID) }

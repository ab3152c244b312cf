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
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/db"
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
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
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
}

// New returns the log.
func New(pool *pgxpool.Pool, cfg Config) *Log {
	cfg = cfg.withDefaults()
	return &Log{db: pool, cfg: cfg, hub: newHub(pool, cfg.Logger)}
}

// Start starts the hub: it LISTENs before Start returns. Old events are
// purged by internal/retention (REVEILLE_APPROVAL_EVENT_RETENTION); a
// reader resuming from before what is kept is told to reload (Window).
func (l *Log) Start(ctx context.Context) error { return l.hub.Start(ctx) }

// Stop stops the hub, which ends every subscription. Stopping twice, or
// without Start, is safe.
func (l *Log) Stop(ctx context.Context) error { return l.hub.Stop(ctx) }

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

// AppendAll is Append for several events of one transaction, in one round
// trip however many (then each one's OnAppend, in order). It returns the
// events with Seq and At filled, in the order given.
func (l *Log) AppendAll(ctx context.Context, q db.Batcher, evs []Event) ([]Event, error) {
	b := &pgx.Batch{}
	for _, ev := range evs {
		if len(ev.Approval) == 0 {
			return nil, fmt.Errorf("appending approval event: no approval object for %s %s", ev.Kind, ev.ApprovalID)
		}
		b.Queue(qAppend, ev.OrgID, ev.Type, ev.Kind, ev.ApprovalID, []byte(ev.Approval))
	}
	out := slices.Clone(evs)
	br := q.SendBatch(ctx, b)
	for i := range out {
		if err := br.QueryRow().Scan(&out[i].Seq, &out[i].At); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("appending approval event: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("appending approval event: %w", err)
	}
	if l.OnAppend != nil {
		for _, ev := range out {
			if err := l.OnAppend(ctx, q, ev); err != nil {
				return nil, fmt.Errorf("approval event hook: %w", err)
			}
		}
	}
	return out, nil
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

// Subscribe registers interest in the org's new events. Subscribe before
// reading, so that nothing committed after the read is missed; Close the
// subscription.
func (l *Log) Subscribe(orgID string) (*Subscription, error) { return l.hub.Subscribe(orgID) }

// Package retention keeps Reveille's tables from growing forever: one
// leader-only loop (internal/leader) purges, table by table, the rows that
// are settled and older than their retention, in bounded batches, each
// batch its own transaction fenced by the leadership's term, yielding
// between batches. What an open wake-up, a pending signal or an
// idempotency window still needs is never taken: each table's statement
// (queries.go) says what it keeps.
//
// Workpool work and its keys (REVEILLE_WORK_RETENTION) and closed streams
// (REVEILLE_STREAM_RETENTION) are purged by their own packages' leaders
// already; this loop does the rest. Adding a table is one entry in Tables.
package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/leader"
)

// Leadership names the purge's leadership (internal/leader).
const Leadership = "retention"

// Defaults of Config.
const (
	DefaultInterval           = 10 * time.Minute
	DefaultBatch              = 1000
	DefaultPause              = 10 * time.Millisecond
	DefaultIdempotencyRecords = 24 * time.Hour
	DefaultSpendKeys          = 24 * time.Hour
	DefaultSettled            = 7 * 24 * time.Hour // wake-ups, approvals, signals, session events
)

// Config configures the purge. Zero values take the defaults noted; every
// retention of a table whose rows hold an idempotency key (wake-ups, tool
// approvals, spend keys) is at least IdempotencyRecords, so that no key is
// forgotten while the API would still replay a response to it.
type Config struct {
	// IdempotencyRecords keeps the API's Idempotency-Key records: a
	// repeated request is replayed for this long
	// (REVEILLE_IDEMPOTENCY_RETENTION; default 24 h).
	IdempotencyRecords time.Duration
	// SpendKeys keeps mandate spends' idempotency rows, counted from the
	// spend (REVEILLE_SPEND_KEY_RETENTION; default 24 h).
	SpendKeys time.Duration
	// MandateApprovals keeps resolved overrun approval requests, counted
	// from their resolution (REVEILLE_MANDATE_APPROVAL_RETENTION; 7 days).
	MandateApprovals time.Duration
	// Wakeups keeps resolved wake-ups whose signal is no longer pending,
	// counted from the resolution (REVEILLE_WAKEUP_RETENTION; 7 days).
	Wakeups time.Duration
	// ToolApprovals keeps decided tool calls, counted from the decision
	// (REVEILLE_TOOL_APPROVAL_RETENTION; 7 days).
	ToolApprovals time.Duration
	// QueueMessages keeps delivered and undeliverable queue messages,
	// counted from their settling; a wake-up's or a tool call's message is
	// kept at least as long as its row (REVEILLE_QUEUE_RETENTION; 7 days).
	QueueMessages time.Duration
	// SessionEvents keeps tool-approval session events, of sessions with
	// no call pending (REVEILLE_SESSION_EVENT_RETENTION; 7 days).
	SessionEvents time.Duration
	// ApprovalEvents keeps the approvals inbox's events (package inbox); a
	// reader resuming from before what is kept is told to reload
	// (REVEILLE_APPROVAL_EVENT_RETENTION; 7 days).
	ApprovalEvents time.Duration

	// Interval is how often the leader purges (REVEILLE_RETENTION_INTERVAL;
	// default 10 min).
	Interval time.Duration
	// Batch bounds the rows one statement deletes (default 1000).
	Batch int
	// Pause is the yield between two batches of a table, so that a large
	// backlog does not hold the database in one burst (default 10 ms).
	Pause time.Duration
	// LeaderRetry is how often a standby tries to take the leadership
	// (default: the elector's, 2 s).
	LeaderRetry time.Duration
	// Now is the clock the cutoffs are taken from (default time.Now).
	Now func() time.Time
	// Logger (default slog.Default()); Registry receives the metric
	// (default: not registered).
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.IdempotencyRecords = cmp.Or(c.IdempotencyRecords, DefaultIdempotencyRecords)
	c.SpendKeys = cmp.Or(c.SpendKeys, DefaultSpendKeys)
	c.MandateApprovals = cmp.Or(c.MandateApprovals, DefaultSettled)
	c.Wakeups = cmp.Or(c.Wakeups, DefaultSettled)
	c.ToolApprovals = cmp.Or(c.ToolApprovals, DefaultSettled)
	c.QueueMessages = cmp.Or(c.QueueMessages, DefaultSettled)
	c.SessionEvents = cmp.Or(c.SessionEvents, DefaultSettled)
	c.ApprovalEvents = cmp.Or(c.ApprovalEvents, DefaultSettled)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Pause = cmp.Or(c.Pause, DefaultPause)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	for _, d := range []time.Duration{c.IdempotencyRecords, c.SpendKeys, c.MandateApprovals, c.Wakeups, c.ToolApprovals,
		c.QueueMessages, c.SessionEvents, c.ApprovalEvents, c.Interval, c.Pause, c.LeaderRetry} {
		if d < 0 {
			return errors.New("retention: durations must not be negative")
		}
	}
	if c.Batch < 0 {
		return errors.New("retention: the batch must not be negative")
	}
	return nil
}

// Table is one purge: SQL deletes at most $2 rows of the table settled
// before $1 (a timestamptz), keeping whatever still needs them. A purge
// whose decision needs rows locked before it is read runs Lock first, in
// the same transaction: it locks and returns the keys ($3, $4: two text
// arrays) SQL then purges, deciding on a snapshot taken once the locks are
// held.
type Table struct {
	Name string        // the table, as the metric's label and the log names it
	Keep time.Duration // its retention
	SQL  string
	Lock string
}

// Tables is the purge list, in the order a pass runs it: a row goes before
// the rows it keeps alive (spend keys before the approvals they name,
// wake-ups and tool calls before their signals).
func (c Config) Tables() []Table {
	keyed := func(d time.Duration) time.Duration { return max(d, c.IdempotencyRecords) }
	return []Table{
		{Name: "idempotency_keys", Keep: c.IdempotencyRecords, SQL: qPurgeIdempotencyKeys},
		{Name: "mandate_spends", Keep: keyed(c.SpendKeys), SQL: qPurgeSpendKeys},
		{Name: "wakeups", Keep: keyed(c.Wakeups), SQL: qPurgeWakeups},
		{Name: "mandate_approvals", Keep: c.MandateApprovals, SQL: qPurgeMandateApprovals},
		{Name: "tool_approvals", Keep: keyed(c.ToolApprovals), SQL: qPurgeToolApprovals},
		{Name: "queue_messages", Keep: c.QueueMessages, SQL: qPurgeQueueMessages},
		{Name: "session_events", Keep: c.SessionEvents, SQL: qPurgeSessionEvents, Lock: qLockIdleSessions},
		{Name: "approval_events", Keep: c.ApprovalEvents, SQL: qPurgeApprovalEvents},
	}
}

// Purger runs the purge on whichever replica leads Leadership.
type Purger struct {
	db     *pgxpool.Pool
	cfg    Config
	tables []Table
	purged *prometheus.CounterVec
	errs   prometheus.Counter // failed passes
	life   leader.Background
}

// New builds a purger of cfg.Tables().
func New(db *pgxpool.Pool, cfg Config) (*Purger, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Purger{db: db, cfg: cfg, tables: cfg.Tables(), purged: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "reveille_retention_purged_total", Help: "Rows purged past their retention, by table.",
	}, []string{"table"}), errs: leader.NewTaskErrors(Leadership)}
	for _, t := range p.tables {
		p.purged.WithLabelValues(t.Name) // every table's series exists from the start
	}
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{p.purged, p.errs} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("retention metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Start runs a pass at once and then every Interval, on the leader only;
// it returns at once and starts once.
func (p *Purger) Start(ctx context.Context) error {
	el := &leader.Elector{DB: p.db, Name: Leadership, Retry: p.cfg.LeaderRetry, Logger: p.cfg.Logger}
	return p.life.Start(ctx, el, leader.Every(p.cfg.Interval, func(ctx context.Context) error {
		_, err := p.Pass(ctx)
		return err
	}, func(err error) {
		p.errs.Inc()
		p.cfg.Logger.Warn("retention pass failed", "error", err.Error())
	}))
}

// Stop stops the purge and waits for it (until ctx ends). Stopping twice,
// or without Start, is safe.
func (p *Purger) Stop(ctx context.Context) error { return p.life.Stop(ctx) }

// Pass purges every table once, as far as it is due, and logs a line with
// the counts. A table that fails is reported and the pass goes on with the
// next; a deposed leader (leader.ErrDeposed) stops at once. It returns the
// rows purged per table and the failures, joined.
func (p *Purger) Pass(ctx context.Context) (map[string]int64, error) {
	start := time.Now()
	counts := make(map[string]int64, len(p.tables))
	var errs []error
	for _, t := range p.tables {
		n, err := p.purge(ctx, t)
		counts[t.Name] = n
		if err != nil {
			err = fmt.Errorf("purging %s: %w", t.Name, err)
			if errors.Is(err, leader.ErrDeposed) || ctx.Err() != nil {
				return counts, err
			}
			errs = append(errs, err)
		}
	}
	attrs := []any{"duration_ms", time.Since(start).Milliseconds()}
	for _, t := range p.tables {
		attrs = append(attrs, t.Name, counts[t.Name])
	}
	p.cfg.Logger.Info("retention pass", attrs...)
	return counts, errors.Join(errs...)
}

// purge deletes t's due rows batch by batch until a batch comes back
// short, each batch in a transaction fenced by ctx's term.
func (p *Purger) purge(ctx context.Context, t Table) (int64, error) {
	cutoff := p.cfg.Now().Add(-t.Keep)
	var total int64
	for {
		var n int64
		err := leader.FencedTx(ctx, p.db, func(tx pgx.Tx) error {
			args := []any{cutoff, p.cfg.Batch}
			if t.Lock != "" {
				rows, err := tx.Query(ctx, t.Lock, cutoff, p.cfg.Batch)
				if err != nil {
					return err
				}
				var first, second []string
				var k1, k2 string
				if _, err := pgx.ForEachRow(rows, []any{&k1, &k2}, func() error {
					first, second = append(first, k1), append(second, k2)
					return nil
				}); err != nil {
					return err
				}
				args = append(args, first, second)
			}
			tag, err := tx.Exec(ctx, t.SQL, args...)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		p.purged.WithLabelValues(t.Name).Add(float64(n))
		if n < int64(p.cfg.Batch) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(p.cfg.Pause):
		}
	}
}

// Package gauges keeps the gauges of Reveille's promise fresh — the signal
// outbox (pending, retrying, undeliverable, the oldest unsent signal's
// age), the wake-ups not yet resolved by state, and the approvals pending
// of both kinds — with one cheap query each (over partial indexes of the
// open rows), every Period.
//
// Every replica runs its own collector, not only a leader: each replica's
// /metrics then shows the whole promise on its own, with no gap while a
// leadership moves after a kill, for four index-only reads per period. The
// values are the database's, so every replica reports the same: aggregate
// them with max(), not sum(). They are read on a period rather than at
// scrape time because /metrics is unauthenticated: a scrape must not be
// able to make the database work.
package gauges

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/startstop"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
)

// Config configures a Collector. Zero values take the defaults noted.
type Config struct {
	// Period is how often the gauges are read (default 15 s, a common
	// scrape interval).
	Period   time.Duration
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Collector refreshes the gauges every Period until Stop.
type Collector struct {
	db     *pgxpool.Pool
	cfg    Config
	life   startstop.Base
	outbox *prometheus.GaugeVec
	oldest prometheus.Gauge
	open   *prometheus.GaugeVec
	asks   *prometheus.GaugeVec
	errors prometheus.Counter
}

// New builds a collector and registers its gauges.
func New(db *pgxpool.Pool, cfg Config) *Collector {
	cfg.Period = cmp.Or(cfg.Period, 15*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Collector{db: db, cfg: cfg,
		outbox: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reveille_signal_outbox_messages",
			Help: "Signals in the outbox not delivered, all orgs, by state: pending (no send failed yet), retrying (the last send failed), undeliverable (failed for good until redelivered).",
		}, []string{"state"}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "reveille_signal_outbox_oldest_pending_seconds",
			Help: "Age of the oldest signal not yet accepted by Temporal (pending or retrying), 0 when none.",
		}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reveille_wakeups_open",
			Help: "Wake-ups not yet resolved, all orgs, by state: awaiting_approval, funded (spent, work not yet enqueued), enqueued (work in the pool).",
		}, []string{"state"}),
		asks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "reveille_pending_approvals",
			Help: "Approval requests pending now, all orgs, by kind: spend (a mandate overrun) or tool (a tool call).",
		}, []string{"kind"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_gauge_refresh_errors_total",
			Help: "Refreshes of the promise's gauges that failed (the gauges keep their last values).",
		}),
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(c.outbox, c.oldest, c.open, c.asks, c.errors)
	}
	return c
}

// Start refreshes the gauges at once and then every Period, until Stop
// (internal/startstop: once).
func (c *Collector) Start(ctx context.Context) error {
	return c.life.Start(ctx, "gauges", c.run)
}

// Stop stops the refreshes and waits for the one in flight (until ctx
// ends); stopping twice is safe.
func (c *Collector) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

func (c *Collector) run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Period)
	defer t.Stop()
	for {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			c.errors.Inc()
			c.cfg.Logger.Warn("refreshing the promise's gauges failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh reads every gauge once. A read that fails leaves its gauges as
// they were; the others are still refreshed.
func (c *Collector) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Period)
	defer cancel()
	var errs []error
	if o, err := queue.ReadOutbox(ctx, c.db); err != nil {
		errs = append(errs, err)
	} else {
		c.outbox.WithLabelValues("pending").Set(float64(o.Pending))
		c.outbox.WithLabelValues("retrying").Set(float64(o.Retrying))
		c.outbox.WithLabelValues("undeliverable").Set(float64(o.Undeliverable))
		c.oldest.Set(o.OldestPending.Seconds())
	}
	if open, err := wakeup.CountOpen(ctx, c.db); err != nil {
		errs = append(errs, err)
	} else {
		for state, n := range open {
			c.open.WithLabelValues(state).Set(float64(n))
		}
	}
	if n, err := mandates.CountPendingApprovals(ctx, c.db); err != nil {
		errs = append(errs, err)
	} else {
		c.asks.WithLabelValues("spend").Set(float64(n))
	}
	if n, err := approvals.CountPending(ctx, c.db); err != nil {
		errs = append(errs, err)
	} else {
		c.asks.WithLabelValues("tool").Set(float64(n))
	}
	return errors.Join(errs...)
}

package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/api/serviceerror"
)

// Signaler sends a Temporal signal; go.temporal.io/sdk/client.Client
// satisfies it.
type Signaler interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// DispatcherConfig configures a Dispatcher. Zero values take the defaults noted.
type DispatcherConfig struct {
	// NotFoundGrace is how long a signal to an absent workflow keeps being
	// retried — it may not have started yet — before the message fails
	// (REVEILLE_SIGNAL_NOTFOUND_GRACE; default 60 s).
	NotFoundGrace time.Duration
	// MinBackoff and MaxBackoff bound the exponential retry delay (defaults
	// 100 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// Lease is how long a claimed message is hidden from other dispatchers
	// while its signal is in flight (default 30 s); a dispatcher that dies
	// mid-send leaves it to be retried after that.
	Lease time.Duration
	// SendTimeout bounds one SignalWorkflow call (default 10 s).
	SendTimeout time.Duration
	// BatchSize is how many messages one claim takes; Concurrency how many
	// signals are in flight at once (defaults 100 and 32).
	BatchSize, Concurrency int
	Logger                 *slog.Logger
	Registry               prometheus.Registerer
}

func (c DispatcherConfig) withDefaults() DispatcherConfig {
	c.NotFoundGrace = cmp.Or(c.NotFoundGrace, 60*time.Second)
	c.MinBackoff = cmp.Or(c.MinBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 30*time.Second)
	c.Lease = cmp.Or(c.Lease, 30*time.Second)
	c.SendTimeout = cmp.Or(c.SendTimeout, 10*time.Second)
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.Concurrency = cmp.Or(c.Concurrency, 32)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Dispatcher delivers signal messages to Temporal. Run one per replica: they
// share the work through SKIP LOCKED claims.
type Dispatcher struct {
	db      *pgxpool.Pool
	signals Signaler
	cfg     DispatcherConfig
	metrics *dispatchMetrics

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
}

// NewDispatcher builds a dispatcher sending through signals.
func NewDispatcher(db *pgxpool.Pool, signals Signaler, cfg DispatcherConfig) *Dispatcher {
	cfg = cfg.withDefaults()
	return &Dispatcher{db: db, signals: signals, cfg: cfg, metrics: newDispatchMetrics(cfg.Registry)}
}

// Start runs the dispatcher in the background until Stop or ctx ends.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		return errors.New("queue: dispatcher already started")
	}
	ctx, d.cancel = context.WithCancel(ctx)
	d.stopped = make(chan struct{})
	go func() {
		defer close(d.stopped)
		d.run(ctx)
	}()
	return nil
}

// Stop stops the dispatcher and waits for in-flight sends (bounded by ctx).
// Stopping twice is safe.
func (d *Dispatcher) Stop(ctx context.Context) error {
	d.mu.Lock()
	cancel, stopped := d.cancel, d.stopped
	d.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run listens for notifications and dispatches whatever is due; it
// reconnects when its listening connection fails.
func (d *Dispatcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := d.listenAndDispatch(ctx)
		if ctx.Err() != nil {
			return
		}
		d.cfg.Logger.Warn("signal dispatcher lost its connection; reconnecting", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (d *Dispatcher) listenAndDispatch(ctx context.Context) error {
	conn, err := d.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Listen before looking, so no notification falls between the two.
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+notifyChannel) }()
	for {
		n, err := d.DispatchOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d.cfg.Logger.Error("dispatching signals failed", "error", err)
		}
		if n == d.cfg.BatchSize {
			continue // more may be due right now
		}
		wait := d.untilNextDue(ctx)
		wctx, cancel := context.WithTimeout(ctx, wait)
		_, err = conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// untilNextDue is how long to sleep when no notification comes: until the
// earliest retry, at most a minute (a safety net, not a poll: NOTIFY wakes us).
func (d *Dispatcher) untilNextDue(ctx context.Context) time.Duration {
	var next *time.Time
	// Spans every org: the dispatcher is the system's outbox worker.
	err := d.db.QueryRow(ctx, `SELECT min(next_attempt_at) FROM queue_messages
		WHERE status = 'pending' AND signal_workflow_id IS NOT NULL`).Scan(&next)
	if err != nil || next == nil {
		return time.Minute
	}
	wait := time.Until(*next)
	return min(max(wait, time.Millisecond), time.Minute)
}

type claimed struct {
	Message
	notFoundSince *time.Time
}

type sendResult struct {
	id            uuid.UUID
	err           error
	notFoundSince *time.Time
	attempts      int
}

// DispatchOnce claims the due signal messages (up to BatchSize), sends them
// concurrently and records each outcome. It returns how many it claimed.
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	msgs, err := d.claim(ctx)
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	results := make([]sendResult, len(msgs))
	sem := make(chan struct{}, d.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
			defer cancel()
			start := time.Now()
			err := d.signals.SignalWorkflow(sctx, m.Signal.WorkflowID, m.Signal.RunID, m.Signal.Name, m.Payload)
			d.metrics.sendSeconds.Observe(time.Since(start).Seconds())
			results[i] = sendResult{id: m.ID, err: err, notFoundSince: m.notFoundSince, attempts: m.Attempts}
		}()
	}
	wg.Wait()
	// Record outcomes even if ctx was canceled mid-send: the signals went out.
	return len(msgs), d.settle(context.WithoutCancel(ctx), msgs, results)
}

func (d *Dispatcher) claim(ctx context.Context) ([]claimed, error) {
	rows, err := d.db.Query(ctx, `
		WITH due AS (
		  SELECT id FROM queue_messages
		   WHERE status = 'pending' AND signal_workflow_id IS NOT NULL AND next_attempt_at <= now()
		   ORDER BY next_attempt_at
		   LIMIT $1
		   FOR UPDATE SKIP LOCKED)
		UPDATE queue_messages m
		   SET attempts = m.attempts + 1, next_attempt_at = now() + $2::interval, updated_at = now()
		  FROM due WHERE m.id = due.id
		RETURNING m.id, m.org_id, m.queue, m.payload, m.idempotency_key, m.status, m.signal_workflow_id, m.signal_run_id,
		          m.signal_name, m.attempts, coalesce(m.last_error, ''), m.next_attempt_at, m.created_at, m.updated_at,
		          m.delivered_at, m.not_found_since`, d.cfg.BatchSize, d.cfg.Lease)
	if err != nil {
		return nil, fmt.Errorf("claim signal messages: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		var wf, run, name *string
		err := row.Scan(&c.ID, &c.OrgID, &c.Queue, &c.Payload, &c.IdempotencyKey, &c.Status, &wf, &run, &name,
			&c.Attempts, &c.LastError, &c.NextAttemptAt, &c.CreatedAt, &c.UpdatedAt, &c.DeliveredAt, &c.notFoundSince)
		c.Signal = &Signal{WorkflowID: deref(wf), RunID: deref(run), Name: deref(name)}
		return c, err
	})
}

// settle writes every send's outcome in three set-based statements.
func (d *Dispatcher) settle(ctx context.Context, msgs []claimed, results []sendResult) error {
	var delivered, failedIDs, retryIDs []uuid.UUID
	var failedReasons, retryReasons []string
	var retryAt []time.Time
	var retryNotFound []*time.Time
	now := time.Now()
	for i, r := range results {
		m := msgs[i]
		switch kind := classify(r.err); kind {
		case sendOK:
			delivered = append(delivered, r.id)
			d.metrics.results.WithLabelValues("delivered").Inc()
			d.metrics.deliverySeconds.Observe(now.Sub(m.CreatedAt).Seconds())
		case sendPermanent:
			failedIDs, failedReasons = append(failedIDs, r.id), append(failedReasons, "rejected by Temporal: "+r.err.Error())
			d.metrics.results.WithLabelValues("failed").Inc()
			d.cfg.Logger.Warn("signal rejected; message failed", "org_id", m.OrgID, "message_id", m.ID, "workflow_id", m.Signal.WorkflowID, "error", r.err)
		case sendNotFound:
			since := r.notFoundSince
			if since == nil {
				since = &now
			}
			if now.Sub(*since) >= d.cfg.NotFoundGrace {
				failedIDs = append(failedIDs, r.id)
				failedReasons = append(failedReasons, fmt.Sprintf("workflow not found for %s (grace %s): %v", now.Sub(*since).Round(time.Second), d.cfg.NotFoundGrace, r.err))
				d.metrics.results.WithLabelValues("failed").Inc()
				d.cfg.Logger.Warn("signal undeliverable: workflow not found past the grace period", "org_id", m.OrgID, "message_id", m.ID, "workflow_id", m.Signal.WorkflowID)
				continue
			}
			retryIDs, retryReasons = append(retryIDs, r.id), append(retryReasons, "workflow not found (yet): "+r.err.Error())
			retryAt, retryNotFound = append(retryAt, now.Add(d.backoff(r.attempts))), append(retryNotFound, since)
			d.metrics.results.WithLabelValues("retry").Inc()
		default:
			retryIDs, retryReasons = append(retryIDs, r.id), append(retryReasons, r.err.Error())
			retryAt, retryNotFound = append(retryAt, now.Add(d.backoff(r.attempts))), append(retryNotFound, nil)
			d.metrics.results.WithLabelValues("retry").Inc()
			d.cfg.Logger.Info("signal send failed; will retry", "org_id", m.OrgID, "message_id", m.ID, "attempts", r.attempts, "error", r.err)
		}
	}
	batch := &pgx.Batch{}
	if len(delivered) > 0 {
		batch.Queue(`UPDATE queue_messages SET status = 'delivered', delivered_at = now(), last_error = NULL, updated_at = now()
			WHERE id = ANY($1) AND status = 'pending'`, delivered)
	}
	if len(failedIDs) > 0 {
		batch.Queue(`UPDATE queue_messages m SET status = 'failed', last_error = f.reason, updated_at = now()
			FROM unnest($1::uuid[], $2::text[]) AS f(id, reason) WHERE m.id = f.id AND m.status = 'pending'`, failedIDs, failedReasons)
	}
	if len(retryIDs) > 0 {
		batch.Queue(`UPDATE queue_messages m SET next_attempt_at = r.at, last_error = r.reason, not_found_since = r.nf, updated_at = now()
			FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::timestamptz[]) AS r(id, at, reason, nf)
			WHERE m.id = r.id AND m.status = 'pending'`, retryIDs, retryAt, retryReasons, retryNotFound)
	}
	if err := d.db.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("record signal outcomes: %w", err)
	}
	return nil
}

// backoff is the capped exponential delay after the given attempt, with
// ±25 % jitter so that a Temporal outage does not end in a thundering herd.
func (d *Dispatcher) backoff(attempts int) time.Duration {
	exp := float64(d.cfg.MinBackoff) * math.Pow(2, float64(max(attempts-1, 0)))
	wait := time.Duration(min(exp, float64(d.cfg.MaxBackoff)))
	return time.Duration(float64(wait) * (0.75 + rand.Float64()/2))
}

type sendKind int

const (
	sendOK sendKind = iota
	sendTransient
	sendNotFound
	sendPermanent
)

// classify decides what a SignalWorkflow error means. NotFound may be a
// workflow that has not started yet; the request's own faults are
// permanent; everything else (Unavailable, deadlines, resource exhaustion,
// a canceled context) is transient.
func classify(err error) sendKind {
	var notFound *serviceerror.NotFound
	var invalid *serviceerror.InvalidArgument
	var denied *serviceerror.PermissionDenied
	switch {
	case err == nil:
		return sendOK
	case errors.As(err, &notFound):
		return sendNotFound
	case errors.As(err, &invalid), errors.As(err, &denied):
		return sendPermanent
	}
	return sendTransient
}

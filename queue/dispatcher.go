package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/listen"
	"github.com/reveille/reveille/internal/startstop"
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
	// while its signal is in flight; a dispatcher that dies mid-send leaves
	// it to be retried after that. Default: long enough for a whole batch of
	// sends that all time out, plus 5 s (at least 30 s).
	Lease time.Duration
	// SendTimeout bounds one SignalWorkflow call, with the history check
	// that may follow it (default 10 s).
	SendTimeout time.Duration
	// HandoffLease is how long a message written by EnqueueForHandoff is
	// hidden from every dispatcher's claim while it waits to be handed off
	// and sent by its writer; should that process die first, another
	// dispatcher sends it after this. It is also the longest an idle
	// dispatcher sleeps between looks at the table, since nothing notifies
	// of such a message. Default SendTimeout + 5 s, as is one not above
	// SendTimeout.
	HandoffLease time.Duration
	// BatchSize is how many messages one claim takes; Concurrency how many
	// signals are in flight at once (defaults 100 and 32).
	BatchSize, Concurrency int
	// History, when a signal meets a closed workflow, tells whether that
	// workflow got the signal all the same (a send whose "delivered" record
	// was lost): then the message is delivered, else undeliverable at once.
	// Default: the Signaler, if it is one. Without it such a message is
	// retried as not found until NotFoundGrace, then fails.
	History HistoryReader
	// ListenPingEvery and ListenPingTimeout: the LISTEN connection is
	// pinged once silent for ListenPingEvery, and a ping (or the UNLISTEN
	// as it stops) may take ListenPingTimeout (defaults 30 s and 10 s, as
	// the other LISTEN connections): one a NAT forgot would otherwise stay
	// up for good, its notifications lost, and hold Stop at its UNLISTEN.
	ListenPingEvery, ListenPingTimeout time.Duration
	// StatementTimeout bounds the dispatcher's claim and its record of
	// the outcomes of a batch (default 10 s): on a connection gone silent
	// (a NAT that forgot it, a failover) they would wait for the kernel to
	// give up, minutes, and the settle with them every slot of the
	// pipeline. An outcome not recorded is sent again once its lease ends.
	StatementTimeout time.Duration
	Logger           *slog.Logger
	Registry         prometheus.Registerer
}

func (c DispatcherConfig) withDefaults() DispatcherConfig {
	c.NotFoundGrace = cmp.Or(c.NotFoundGrace, 60*time.Second)
	c.MinBackoff = cmp.Or(c.MinBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 30*time.Second)
	c.SendTimeout = cmp.Or(c.SendTimeout, 10*time.Second)
	if c.HandoffLease <= c.SendTimeout {
		c.HandoffLease = c.SendTimeout + 5*time.Second
	}
	c.ListenPingEvery = cmp.Or(c.ListenPingEvery, 30*time.Second)
	c.ListenPingTimeout = cmp.Or(c.ListenPingTimeout, 10*time.Second)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, 10*time.Second)
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.Concurrency = cmp.Or(c.Concurrency, 32)
	rounds := time.Duration((c.BatchSize + c.Concurrency - 1) / c.Concurrency)
	c.Lease = cmp.Or(c.Lease, max(30*time.Second, rounds*c.SendTimeout+5*time.Second))
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
	history HistoryReader // nil: closed workflows are not looked into
	cfg     DispatcherConfig
	metrics *dispatchMetrics
	life    startstop.Base

	// handoffs are committed messages handed over by their writer in this
	// process, waiting for room in the pipeline (taken while life.Running).
	handoffs chan *Handoff
	// handoffMu orders Handoff's send against the stop's last look at
	// handoffs; handoffsClosed: that look was taken, later ones are dropped.
	handoffMu      sync.Mutex
	handoffsClosed bool

	// now is this host's clock (a test's skewed one): it times the grace
	// of a signal to an absent workflow, never a due time, which the
	// database's clock keeps (next_attempt_at is compared with its now()).
	now func() time.Time
}

// NewDispatcher builds a dispatcher sending through signals.
func NewDispatcher(db *pgxpool.Pool, signals Signaler, cfg DispatcherConfig) *Dispatcher {
	cfg = cfg.withDefaults()
	history := cfg.History
	if h, ok := signals.(HistoryReader); ok && history == nil {
		history = h
	}
	return &Dispatcher{db: db, signals: signals, history: history, cfg: cfg, metrics: newDispatchMetrics(cfg.Registry),
		handoffs: make(chan *Handoff, cfg.BatchSize), now: time.Now}
}

// Start runs the dispatcher in the background until Stop or ctx ends
// (internal/startstop: once).
func (d *Dispatcher) Start(ctx context.Context) error {
	return d.life.Start(ctx, "queue dispatcher", d.run)
}

// Stop stops the dispatcher and waits for in-flight sends (bounded by ctx).
// Stopping twice is safe.
func (d *Dispatcher) Stop(ctx context.Context) error { return d.life.Stop(ctx) }

// run listens for notifications and dispatches whatever is due; it
// reconnects when its listening connection fails, with the LISTEN hubs'
// capped backoff: at a fixed second it logged a warning every second of a
// Postgres outage. The backoff starts over only after a connection that
// listened for longer than its cap — one that fails again at once (a
// query that keeps failing) must not be retried every 50 ms.
func (d *Dispatcher) run(ctx context.Context) {
	backoff := listen.NewReconnectBackoff()
	// However the run ends — listening, reconnecting or backing off — the
	// handoffs accepted and not sent are released for any dispatcher.
	defer d.releaseHandoffs(context.WithoutCancel(ctx))
	var listenedAt time.Time
	for ctx.Err() == nil {
		listenedAt = time.Time{}
		err := d.listenAndDispatch(ctx, func() { listenedAt = time.Now() })
		if ctx.Err() != nil {
			return
		}
		msg := "signal dispatcher reconnect failed"
		if !listenedAt.IsZero() {
			msg = "signal dispatcher lost its connection; reconnecting"
			if time.Since(listenedAt) > backoff.Max {
				backoff.Reset()
			}
		}
		wait := backoff.Next()
		d.cfg.Logger.Warn(msg, "error", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// listenAndDispatch claims and sends whatever is due whenever NOTIFY says
// so. It does not wait for one claim's signals before the next claim: a
// message committed while earlier signals are in flight (a slow Temporal)
// is claimed and sent at once, not after the slowest of them. At most
// BatchSize messages are claimed and unsettled at a time. listening is
// called once the connection LISTENs.
func (d *Dispatcher) listenAndDispatch(ctx context.Context, listening func()) error {
	conn, err := d.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Listen before looking, so no notification falls between the two.
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	defer func() {
		// Bounded: on a connection gone silent the UNLISTEN would wait for
		// the kernel to give up on it (minutes), holding Stop, the pool's
		// Close and this connection; one that does not answer is closed,
		// and the pool drops it.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ListenPingTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, "UNLISTEN "+notifyChannel); err != nil {
			_ = conn.Conn().Close(uctx)
		}
	}()
	listening()
	heard := time.Now() // the connection last answered or notified
	p := d.newPipeline(ctx)
	defer p.close()
	hctx, stopHandoffs := context.WithCancel(ctx)
	handoffsDone := make(chan struct{})
	go func() {
		defer close(handoffsDone)
		p.takeHandoffs(hctx)
	}()
	// Before the pipeline closes: it may add sends until it returns.
	defer func() {
		stopHandoffs()
		<-handoffsDone
		if ctx.Err() != nil {
			d.releaseHandoffs(context.WithoutCancel(ctx))
		}
	}()
	for {
		free := p.free()
		if free > 0 {
			n, err := p.claimAndSend(ctx, free)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				d.cfg.Logger.Error("dispatching signals failed", "error", err)
			}
			if n == free {
				continue // more may be due right now
			}
		} else {
			// Full: claim again once a settled send makes room (the
			// notifications meanwhile wait in the connection).
			select {
			case <-ctx.Done():
				return nil
			case <-p.room:
			}
			continue
		}
		p.clearRetry() // the wait computed next covers the retries settled so far
		// (no longer than until the connection is due a ping)
		until, dueBusy := d.untilNextDue(ctx, p.busyWorkflows())
		p.passOver(dueBusy) // (their sends in flight end in a look)
		wait := min(until, max(d.cfg.ListenPingEvery-time.Since(heard), time.Millisecond))
		wctx, cancel := context.WithTimeout(ctx, wait)
		p.waiting(cancel)
		_, err := conn.Conn().WaitForNotification(wctx)
		p.waiting(nil)
		cancel()
		switch {
		case err == nil:
			heard = time.Now()
		case errors.Is(err, context.DeadlineExceeded):
			// A connection silent this long is pinged, as every LISTEN
			// connection is: one a NAT forgot would otherwise stay up
			// for good, its notifications lost (every signal then waits
			// for the due poll).
			if time.Since(heard) < d.cfg.ListenPingEvery {
				break
			}
			pctx, cancel := context.WithTimeout(ctx, d.cfg.ListenPingTimeout)
			err := conn.Ping(pctx)
			cancel()
			switch {
			case err == nil:
				heard = time.Now()
			case ctx.Err() != nil:
				return nil
			default:
				return fmt.Errorf("ping: %w", err)
			}
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, context.Canceled):
			// A settle scheduled a retry, perhaps before the wait ends.
		default:
			return err
		}
	}
}

// pipeline sends claimed messages as they are claimed and settles their
// outcomes in batches as they come in.
type pipeline struct {
	d        *Dispatcher
	ctx      context.Context // the sends run under it
	stopping <-chan struct{} // closed by Stop: start no send that must wait for a slot
	sem      chan struct{}   // Concurrency: signals in flight
	results  chan sent
	// A settle made room under BatchSize: for the claims, for takeHandoffs.
	room, handoffRoom chan struct{}
	sends             sync.WaitGroup
	settled           chan struct{} // closed when the settler has finished

	mu sync.Mutex
	// busy: the workflows a send is in flight to (or waits for a slot),
	// each with the messages held behind that send, sent one after the
	// other. One workflow whose sends hang (its lock held, its shard
	// slow) so takes one slot, not all of them: claimed in due order, its
	// backlog took every slot and every claim, and every other workflow's
	// signals waited rounds of SendTimeout behind it.
	busy map[string][]claimed
	// passedOver: busy workflows found with due messages (untilNextDue);
	// once its send is done, the dispatcher looks again at once.
	passedOver map[string]bool
	pending    int                // claimed and not yet settled
	retry      bool               // a settle scheduled a retry since clearRetry()
	wake       context.CancelFunc // ends the current wait for a notification
}

type sent struct {
	m claimed
	r sendResult
	// skipped: a handoff whose lease ran short while it waited for a
	// send slot; it was not sent and is left to the due-poll.
	skipped bool
	// released: still waiting for a send slot when the dispatcher
	// stopped; it was not sent and is made due again for any dispatcher.
	released bool
}

func (d *Dispatcher) newPipeline(ctx context.Context) *pipeline {
	// Sends are not canceled by Stop: a signal in flight finishes (each is
	// bounded by SendTimeout) and its outcome is recorded, rather than being
	// cut off after Temporal may have received it.
	p := &pipeline{d: d, ctx: context.WithoutCancel(ctx), stopping: ctx.Done(), sem: make(chan struct{}, d.cfg.Concurrency), results: make(chan sent, d.cfg.BatchSize),
		room: make(chan struct{}, 1), handoffRoom: make(chan struct{}, 1), settled: make(chan struct{}), busy: map[string][]claimed{},
		passedOver: map[string]bool{}}
	// Outcomes are recorded even after ctx ends: the signals went out.
	go p.settler(context.WithoutCancel(ctx))
	return p
}

func (p *pipeline) clearRetry() {
	p.mu.Lock()
	p.retry = false
	p.mu.Unlock()
}

// waiting registers the cancel of the wait about to start (nil when it
// ended); a retry scheduled since clearRetry() ends it at once.
func (p *pipeline) waiting(cancel context.CancelFunc) {
	p.mu.Lock()
	p.wake = cancel
	retry := p.retry
	p.mu.Unlock()
	if retry && cancel != nil {
		cancel()
	}
}

func (p *pipeline) free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.d.cfg.BatchSize - p.pending
}

// sendFailuresBeforeWarn: every this many failed sends of one message, the
// failure is logged at the warn level (the others at info).
const sendFailuresBeforeWarn = 5

// claimAndSend claims up to limit due messages and starts their sends.
// The claim is not canceled by Stop: one cut off after its commit reached
// the server would leave its messages claimed, an attempt counted, and
// unsent until their lease ended; finished, they are sent within the stop
// like the sends in flight.
func (p *pipeline) claimAndSend(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.d.cfg.StatementTimeout) // (a stop lets it finish)
	defer cancel()
	msgs, err := p.d.claim(cctx, limit, p.busyWorkflows())
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	p.start(msgs)
	return len(msgs), nil
}

// start sends msgs, claimed by this dispatcher, as the semaphore allows
// and one workflow at a time (busy); the settler records each outcome.
func (p *pipeline) start(msgs []claimed) {
	p.mu.Lock()
	p.pending += len(msgs)
	var now []claimed
	for _, m := range msgs {
		wf := m.Signal.WorkflowID
		if held, ok := p.busy[wf]; ok {
			p.busy[wf] = append(held, m)
			continue
		}
		p.busy[wf] = nil
		now = append(now, m)
	}
	p.mu.Unlock()
	for _, m := range now {
		p.sends.Add(1)
		go p.sendOne(m, false)
	}
}

// sendOne sends m when a slot is free, hands its outcome to the settler,
// and starts the next message held behind it for its workflow. One held
// (behind a send to its workflow) is released once the dispatcher stops:
// sent, it would hold the stop for another round of sends.
func (p *pipeline) sendOne(m claimed, behind bool) {
	defer p.sends.Done()
	if behind && p.isStopping() {
		if !m.handoffLeaseEnd.IsZero() {
			p.d.metrics.handoffs.WithLabelValues("released").Inc()
		}
		p.results <- sent{m: m, released: true}
	} else {
		p.results <- p.sendInSlot(m)
	}
	wf := m.Signal.WorkflowID
	p.mu.Lock()
	held := p.busy[wf]
	if len(held) == 0 {
		delete(p.busy, wf)
		var wake context.CancelFunc
		if p.passedOver[wf] {
			delete(p.passedOver, wf)
			wake = p.lookAgainLocked()
		}
		p.mu.Unlock()
		if wake != nil {
			wake()
		}
		return
	}
	next := held[0]
	p.busy[wf] = held[1:]
	p.sends.Add(1) // (before this send's Done: close waits for both)
	p.mu.Unlock()
	go p.sendOne(next, true)
}

func (p *pipeline) isStopping() bool {
	select {
	case <-p.stopping:
		return true
	default:
		return false
	}
}

func (p *pipeline) sendInSlot(m claimed) sent {
	handoff := !m.handoffLeaseEnd.IsZero()
	if !p.acquire() {
		if handoff {
			p.d.metrics.handoffs.WithLabelValues("released").Inc()
		}
		return sent{m: m, released: true}
	}
	if handoff && time.Until(m.handoffLeaseEnd) <= p.d.cfg.SendTimeout {
		// Its lease may end mid-send, and another dispatcher claim it.
		<-p.sem
		p.d.metrics.handoffs.WithLabelValues("expired").Inc()
		return sent{m: m, skipped: true}
	}
	if handoff {
		p.d.metrics.handoffs.WithLabelValues("sent").Inc()
	}
	r := p.d.send(p.ctx, m)
	<-p.sem
	return sent{m: m, r: r}
}

// passOver notes busy workflows with due messages, which the claims pass
// over; one no longer busy by now is looked for again at once.
func (p *pipeline) passOver(wfs []string) {
	var wake context.CancelFunc
	p.mu.Lock()
	for _, wf := range wfs {
		if _, ok := p.busy[wf]; ok {
			p.passedOver[wf] = true
		} else {
			wake = p.lookAgainLocked()
		}
	}
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// lookAgainLocked has the dispatcher claim again at once, as a settled
// retry does: it ends the current wait (the caller calls what it returns,
// once it has let go of p.mu) or the next one.
func (p *pipeline) lookAgainLocked() context.CancelFunc {
	p.retry = true
	return p.wake
}

// busyWorkflows are the workflows a send is in flight to: a claim passes
// over their messages (each is sent after the one in flight, by whichever
// dispatcher claims it then).
func (p *pipeline) busyWorkflows() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.busy))
	for wf := range p.busy {
		out = append(out, wf)
	}
	return out
}

// acquire takes a send slot. Once the dispatcher is stopping it takes only
// a free one: a message that would wait for a slot is released instead
// (settler), so that a stop waits for one round of sends at most — with
// Temporal slow, BatchSize/Concurrency rounds of SendTimeout each would
// outlast the service's stop timeout.
func (p *pipeline) acquire() bool {
	select {
	case p.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case p.sem <- struct{}{}:
	case <-p.stopping:
		return false
	}
	select {
	case <-p.stopping: // (both were ready, and select chose at random)
		<-p.sem
		return false
	default:
		return true
	}
}

// settler records outcomes: whatever has arrived when it is free, in one
// settle, so that the batches grow with the load.
func (p *pipeline) settler(ctx context.Context) {
	defer close(p.settled)
	for first := range p.results {
		batch := []sent{first}
	more:
		for len(batch) < p.d.cfg.BatchSize {
			select {
			case s, ok := <-p.results:
				if !ok {
					break more
				}
				batch = append(batch, s)
			default:
				break more
			}
		}
		msgs, results := make([]claimed, 0, len(batch)), make([]sendResult, 0, len(batch))
		var released []claimed
		for _, s := range batch {
			switch {
			case s.released:
				released = append(released, s.m)
			case !s.skipped:
				msgs, results = append(msgs, s.m), append(results, s.r)
			}
		}
		if len(released) > 0 {
			p.d.release(ctx, released)
		}
		// (A batch of skipped handoffs only has nothing to record.)
		if len(msgs) > 0 {
			if err := p.d.settle(ctx, msgs, results); err != nil {
				// Unsettled messages are sent again once their lease ends.
				p.d.cfg.Logger.Error("recording signal outcomes failed", "error", err)
			}
		}
		retry := slices.ContainsFunc(results, func(r sendResult) bool { k := r.kind(); return k != sendOK && k != sendRecovered })
		p.mu.Lock()
		p.pending -= len(batch)
		wake := p.wake
		if retry {
			// The dispatcher may be asleep until a later due time than
			// this retry's: wake it to look again.
			p.retry = true
		} else {
			wake = nil
		}
		p.mu.Unlock()
		if wake != nil {
			wake()
		}
		for _, room := range []chan struct{}{p.room, p.handoffRoom} {
			select {
			case room <- struct{}{}:
			default:
			}
		}
	}
}

// close waits for the sends in flight and the settling of their outcomes.
func (p *pipeline) close() {
	p.sends.Wait()
	close(p.results)
	<-p.settled
}

// untilNextDue is how long to sleep when no notification comes: until the
// earliest retry or lease end, at most HandoffLease (and a minute). That
// bound is the poll that finds a handed-off message whose writer died: its
// insert notified no one, so a dispatcher asleep since before it would not
// look otherwise. It also returns the busy workflows with due messages,
// which the claims pass over (or which fell due since the last claim's
// snapshot): each is looked at again once its send in flight ends.
func (d *Dispatcher) untilNextDue(ctx context.Context, busy []string) (time.Duration, []string) {
	longest := min(d.cfg.HandoffLease, time.Minute)
	var secs *float64
	var dueBusy []string
	b := &pgx.Batch{}
	// Spans every org: the dispatcher is the system's outbox worker. Due
	// by the database's clock, which the claim compares with: by this
	// host's, a clock ahead woke too early and polled until it was due.
	// (Not the busy workflows' due messages, which the claim passes over:
	// their sends in flight end in a new look. Their messages due later
	// count: once due, the wait after a claim notes them. An index
	// read to the first row that counts, not an aggregate over every
	// pending message: an outage's backlog is read at every wait.)
	b.Queue(`SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 FROM queue_messages
		WHERE status = 'pending' AND signal_workflow_id IS NOT NULL
		  AND (next_attempt_at > now() OR NOT (signal_workflow_id = ANY(coalesce($1::text[], '{}'))))`, busy).QueryRow(func(r pgx.Row) error {
		return r.Scan(&secs)
	})
	if len(busy) > 0 {
		// (the due messages only, by the same index: a stuck workflow's
		// due backlog is read here, at each wait while it is busy)
		b.Queue(`SELECT coalesce(array_agg(DISTINCT signal_workflow_id), '{}') FROM queue_messages
			WHERE status = 'pending' AND signal_workflow_id = ANY($1) AND next_attempt_at <= now()`, busy).QueryRow(func(r pgx.Row) error {
			return r.Scan(&dueBusy)
		})
	}
	if err := d.db.SendBatch(ctx, b).Close(); err != nil || secs == nil {
		return longest, dueBusy
	}
	wait := time.Duration(*secs * float64(time.Second))
	return min(max(wait, time.Millisecond), longest), dueBusy
}

type claimed struct {
	Message
	notFoundSince *time.Time
	// handoffLeaseEnd is, for a handed-off message, when its lease ends by
	// this process's clock (zero for a claimed one, whose Lease allows for
	// the wait in the pipeline).
	handoffLeaseEnd time.Time
}

type sendResult struct {
	id            uuid.UUID
	err           error
	notFoundSince *time.Time
	attempts      int
	// closed is what a NotFound's workflow told on a closer look (zero:
	// not looked into).
	closed closedVerdict
}

// kind is what the send's outcome means for the message.
func (r sendResult) kind() sendKind {
	switch r.closed {
	case closedWithSignal:
		return sendRecovered
	case closedWithoutSignal:
		return sendClosed
	case running:
		return sendTransient
	}
	return classify(r.err)
}

// DispatchOnce claims the due signal messages (up to BatchSize), sends them
// concurrently and records each outcome. It returns how many it claimed.
// (The running dispatcher does the same without waiting between claims.)
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	msgs, err := d.claim(ctx, d.cfg.BatchSize, nil)
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
			results[i] = d.send(ctx, m)
		}()
	}
	wg.Wait()
	// Record outcomes even if ctx was canceled mid-send: the signals went out.
	return len(msgs), d.settle(context.WithoutCancel(ctx), msgs, results)
}

// send makes one SignalWorkflow call for m and, should it meet NotFound,
// looks into the workflow (within the same SendTimeout, which the Lease
// allows for).
func (d *Dispatcher) send(ctx context.Context, m claimed) sendResult {
	sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
	defer cancel()
	start := time.Now()
	err := d.signals.SignalWorkflow(sctx, m.Signal.WorkflowID, m.Signal.RunID, m.Signal.Name, m.Payload)
	d.metrics.sendSeconds.Observe(time.Since(start).Seconds())
	r := sendResult{id: m.ID, err: err, notFoundSince: m.notFoundSince, attempts: m.Attempts}
	if d.history != nil && classify(err) == sendNotFound {
		verdict, cerr := d.checkClosed(sctx, m)
		if cerr != nil {
			// Left to the NotFound grace, looked into again at the next send.
			d.cfg.Logger.Info("could not look into the workflow a signal did not find", "org_id", m.OrgID, "message_id", m.ID,
				"workflow_id", m.Signal.WorkflowID, "error", cerr)
		}
		r.closed = verdict
	}
	return r
}

// claim leases up to limit due messages. The claim commits without waiting
// for the WAL flush — it is on every signal's path: if a crash loses it,
// the message is simply claimed and sent again, which at-least-once
// delivery allows.
func (d *Dispatcher) claim(ctx context.Context, limit int, busy []string) ([]claimed, error) {
	b := &pgx.Batch{}
	// The batch is one implicit transaction: the setting is local to it.
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(`
		WITH ready AS (
		  -- (the due messages in due order, but for workflows this
		  -- dispatcher is sending to already; a window of them, read
		  -- without locks: DISTINCT ON takes no FOR UPDATE)
		  SELECT id, signal_workflow_id, next_attempt_at FROM queue_messages
		   WHERE status = 'pending' AND signal_workflow_id IS NOT NULL AND next_attempt_at <= now()
		     AND NOT (signal_workflow_id = ANY(coalesce($3::text[], '{}')))
		   ORDER BY next_attempt_at
		   LIMIT $1 * 4
		), first AS (
		  -- one a workflow: its next ones wait for this one's send (the
		  -- wait after the claim notes a busy workflow with more due)
		  SELECT DISTINCT ON (signal_workflow_id) id, next_attempt_at FROM ready
		   ORDER BY signal_workflow_id, next_attempt_at
		), due AS (
		  SELECT q.id FROM queue_messages q JOIN first f ON f.id = q.id
		   WHERE q.status = 'pending' AND q.next_attempt_at <= now()
		   ORDER BY q.next_attempt_at
		   LIMIT $1
		   FOR UPDATE OF q SKIP LOCKED)
		UPDATE queue_messages m
		   SET attempts = m.attempts + 1, next_attempt_at = now() + $2::interval, updated_at = now()
		  FROM due WHERE m.id = due.id
		RETURNING m.id, m.org_id, m.queue, m.payload, m.idempotency_key, m.status, m.signal_workflow_id, m.signal_run_id,
		          m.signal_name, m.attempts, coalesce(m.last_error, ''), m.next_attempt_at, m.created_at, m.updated_at,
		          m.delivered_at, extract(epoch FROM now() - m.not_found_since)::float8`, limit, d.cfg.Lease, busy)
	br := db.SendBatch(ctx, d.db, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claim signal messages: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claim signal messages: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		var wf, run, name *string
		var notFoundFor *float64 // by the database's clock
		err := row.Scan(&c.ID, &c.OrgID, &c.Queue, &c.Payload, &c.IdempotencyKey, &c.Status, &wf, &run, &name,
			&c.Attempts, &c.LastError, &c.NextAttemptAt, &c.CreatedAt, &c.UpdatedAt, &c.DeliveredAt, &notFoundFor)
		if notFoundFor != nil {
			since := d.now().Add(-time.Duration(*notFoundFor * float64(time.Second)))
			c.notFoundSince = &since
		}
		c.Signal = &Signal{WorkflowID: deref(wf), RunID: deref(run), Name: deref(name)}
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim signal messages: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("claim signal messages: %w", err)
	}
	return msgs, nil
}

// settle writes every send's outcome in three set-based statements.
func (d *Dispatcher) settle(ctx context.Context, msgs []claimed, results []sendResult) error {
	// Failures and retries are guarded by the attempt count of this claim:
	// should the lease have run out and another dispatcher re-claimed a
	// message, only the newer claim's failure is recorded. A delivery is
	// not: it happened, whichever claim made it (the newer claim's send may
	// only find the workflow gone, woken by this one).
	var delivered, failedIDs, retryIDs []uuid.UUID
	var failedAttempts, retryAttempts []int32
	var failedReasons, retryReasons []string
	var retryIn []int64      // µs from the database's now()
	var retryNotFound []bool // a NotFound: its grace runs from the first one, by the database's clock
	now := d.now()
	for i, r := range results {
		m := msgs[i]
		switch kind := r.kind(); kind {
		case sendRecovered:
			// Temporal took an earlier send whose "delivered" record was
			// lost; the workflow closed since, so this send found it gone.
			delivered = append(delivered, r.id)
			d.metrics.results.WithLabelValues("recovered").Inc()
			d.cfg.Logger.Info("lost delivery record recovered from the workflow's history: the closed workflow got the signal",
				"org_id", m.OrgID, "message_id", m.ID, subjectKey(m.Queue), m.IdempotencyKey, "workflow_id", m.Signal.WorkflowID)
		case sendClosed:
			// A closed run never takes a signal: no grace to wait out.
			failedIDs, failedAttempts = append(failedIDs, r.id), append(failedAttempts, int32(r.attempts))
			failedReasons = append(failedReasons, "workflow closed without this signal: "+r.err.Error())
			d.metrics.results.WithLabelValues("failed").Inc()
			d.cfg.Logger.Warn("signal undeliverable: its workflow closed without it", "org_id", m.OrgID, "message_id", m.ID,
				subjectKey(m.Queue), m.IdempotencyKey, "workflow_id", m.Signal.WorkflowID)
		case sendOK:
			delivered = append(delivered, r.id)
			d.cfg.Logger.DebugContext(ctx, "signal sent", "org_id", m.OrgID, "message_id", m.ID, subjectKey(m.Queue), m.IdempotencyKey, "workflow_id", m.Signal.WorkflowID)
			d.metrics.results.WithLabelValues("delivered").Inc()
			d.metrics.deliverySeconds.Observe(now.Sub(m.CreatedAt).Seconds())
		case sendPermanent:
			failedIDs, failedReasons = append(failedIDs, r.id), append(failedReasons, "rejected by Temporal: "+r.err.Error())
			failedAttempts = append(failedAttempts, int32(r.attempts))
			d.metrics.results.WithLabelValues("failed").Inc()
			d.cfg.Logger.Warn("signal rejected; message failed", "org_id", m.OrgID, "message_id", m.ID, subjectKey(m.Queue), m.IdempotencyKey,
				"workflow_id", m.Signal.WorkflowID, "error", r.err)
		case sendNotFound:
			since := r.notFoundSince
			if since == nil {
				since = &now
			}
			// (past the grace, or so near its end that no backoff fits: a
			// retry set for the end could be due at once by the database's
			// clock, claimed again and again until ours caught up)
			if end := since.Add(d.cfg.NotFoundGrace); end.Sub(now) < d.cfg.MinBackoff {
				failedIDs, failedAttempts = append(failedIDs, r.id), append(failedAttempts, int32(r.attempts))
				failedReasons = append(failedReasons, fmt.Sprintf("workflow not found for %s (grace %s): %v", now.Sub(*since).Round(time.Second), d.cfg.NotFoundGrace, r.err))
				d.metrics.results.WithLabelValues("failed").Inc()
				d.cfg.Logger.Warn("signal undeliverable: workflow not found past the grace period", "org_id", m.OrgID, "message_id", m.ID,
					subjectKey(m.Queue), m.IdempotencyKey, "workflow_id", m.Signal.WorkflowID)
				continue
			}
			retryIDs, retryReasons = append(retryIDs, r.id), append(retryReasons, "workflow not found (yet): "+r.err.Error())
			retryAttempts = append(retryAttempts, int32(r.attempts))
			// (the last try when the grace ends, not a backoff past it)
			in := min(d.backoff(r.attempts), since.Add(d.cfg.NotFoundGrace).Sub(now))
			retryIn, retryNotFound = append(retryIn, in.Microseconds()), append(retryNotFound, true)
			d.metrics.results.WithLabelValues("retry").Inc()
		default:
			retryIDs, retryReasons = append(retryIDs, r.id), append(retryReasons, r.err.Error())
			retryAttempts = append(retryAttempts, int32(r.attempts))
			retryIn, retryNotFound = append(retryIn, d.backoff(r.attempts).Microseconds()), append(retryNotFound, false)
			d.metrics.results.WithLabelValues("retry").Inc()
			// (Info, but every sendFailuresBeforeWarn-th failure of a
			// message a Warn: an outage of Temporal shows at the warn level
			// without a line per retry of every message)
			level, msg := slog.LevelInfo, "signal send to Temporal failed; will retry with backoff"
			if r.attempts >= sendFailuresBeforeWarn && r.attempts%sendFailuresBeforeWarn == 0 {
				level, msg = slog.LevelWarn, "signal send to Temporal keeps failing; retrying with backoff"
			}
			d.cfg.Logger.Log(ctx, level, msg, "org_id", m.OrgID, "message_id", m.ID, subjectKey(m.Queue), m.IdempotencyKey,
				"workflow_id", m.Signal.WorkflowID, "attempts", r.attempts, "error", r.err)
		}
	}
	batch := &pgx.Batch{}
	if len(delivered) > 0 {
		batch.Queue(`UPDATE queue_messages m SET status = 'delivered', delivered_at = now(), last_error = NULL, updated_at = now()
			WHERE m.id = ANY($1) AND m.status = 'pending'`, delivered)
	}
	if len(failedIDs) > 0 {
		batch.Queue(`UPDATE queue_messages m SET status = 'failed', last_error = f.reason, updated_at = now()
			FROM unnest($1::uuid[], $2::text[], $3::int[]) AS f(id, reason, attempts)
			WHERE m.id = f.id AND m.attempts = f.attempts AND m.status = 'pending'`, failedIDs, failedReasons, failedAttempts)
	}
	if len(retryIDs) > 0 {
		// (a backoff from the database's now(), which the claim compares
		// next_attempt_at with: from this host's, a retry was due late or
		// early by the clocks' skew)
		batch.Queue(`UPDATE queue_messages m SET next_attempt_at = now() + r.us * interval '1 microsecond', last_error = r.reason,
			  not_found_since = CASE WHEN r.nf THEN coalesce(m.not_found_since, now()) END, updated_at = now()
			FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::bool[], $5::int[]) AS r(id, us, reason, nf, attempts)
			WHERE m.id = r.id AND m.attempts = r.attempts AND m.status = 'pending'`, retryIDs, retryIn, retryReasons, retryNotFound, retryAttempts)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StatementTimeout)
	defer cancel()
	if err := d.db.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("record signal outcomes: %w", err)
	}
	return nil
}

// release makes messages this dispatcher claimed but did not send (it
// stopped first) due again for any dispatcher (unclaim).
func (d *Dispatcher) release(ctx context.Context, msgs []claimed) {
	released, err := d.unclaim(ctx, msgs)
	if err != nil {
		d.cfg.Logger.Warn("releasing unsent signals at stop failed; they are sent after their lease", "count", len(msgs), "error", err.Error())
		return
	}
	d.metrics.results.WithLabelValues("released").Add(float64(released))
	d.cfg.Logger.Info("released claimed signals the stop left unsent, for any dispatcher", "count", released)
}

// unclaim makes msgs, claimed by this dispatcher and not sent, due again at
// once, their unmade attempt uncounted, and tells the dispatchers, rather
// than leave them hidden until their lease ends. A message claimed again
// since (its lease ran out first) is left alone: its attempt count moved
// on. It returns how many it made due.
func (d *Dispatcher) unclaim(ctx context.Context, msgs []claimed) (int64, error) {
	ids, attempts := make([]uuid.UUID, len(msgs)), make([]int32, len(msgs))
	for i, m := range msgs {
		ids[i], attempts[i] = m.ID, int32(m.Attempts)
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	// Spans orgs: the stopping dispatcher's own claims, by id.
	var released int64
	err := d.db.QueryRow(ctx, `
		WITH released AS (
		  UPDATE queue_messages m SET attempts = m.attempts - 1, next_attempt_at = now(), updated_at = now()
		  FROM unnest($1::uuid[], $2::int[]) AS r(id, attempts)
		  WHERE m.id = r.id AND m.attempts = r.attempts AND m.status = 'pending' AND m.next_attempt_at > now()
		  RETURNING 1)
		SELECT (SELECT count(*) FROM released),
		       (SELECT count(*) FROM (SELECT pg_notify($3, '') FROM (SELECT 1 FROM released LIMIT 1) r) n)`,
		ids, attempts, notifyChannel).Scan(&released, new(int64))
	return released, err
}

// subjectKey names a message's idempotency key in the log lines: every
// signal's key is its subject's id (the wake-up's in queue "wakeup", the
// tool approval's in "tool_approval"), logged as "<queue>_id".
func subjectKey(queue string) string { return queue + "_id" }

// backoff is the capped exponential delay after the given attempt, with
// ±25 % jitter (after the cap: MinBackoff·0.75 … MaxBackoff·1.25) so that a
// Temporal outage does not end in a thundering herd.
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
	// Only from a closer look at a NotFound's workflow (sendResult.kind):
	sendRecovered // closed, having got this signal: delivered
	sendClosed    // closed without it: undeliverable at once
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

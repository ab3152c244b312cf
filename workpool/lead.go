package workpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/reveille/reveille/internal/leader"
)

const (
	// cancelationBatch bounds the cancelations one iteration processes.
	cancelationBatch = 100
	// purgeBatch bounds one retention purge statement.
	purgeBatch = 1000
	// notifyChunk keeps a cancel notification's id list under Postgres's
	// 8000-byte payload limit.
	notifyChunk = 7000
)

// loop is one pool's main loop on this replica: a leadership candidate
// that, while it leads, runs iterations (iteration.go, fast.go) until it
// runs out of work, then waits for a kick or a timer. This file is its
// leadership and its waiting.
type loop struct {
	m     *Manager
	pool  string
	kickc chan struct{}
	// repairc asks the leader's chores for a repair of the org queues now
	// (outlook: ready work that did not start while nothing runs may be
	// work no queue names, which no start sees).
	repairc chan struct{}

	leading atomic.Bool
	// startsBlocked: the last published status was "scheduled" and nothing
	// can start (every slot taken, or the pool paused), so enqueue kicks
	// cannot help. (Not while "idle": the first enqueue must make the loop
	// publish that work waits; and never while an iteration runs, since what
	// it publishes may predate the enqueue.)
	startsBlocked atomic.Bool
	paused        atomic.Bool  // the pool row said so at the last iteration
	freed         atomic.Bool  // a kick said slots were freed or work canceled since the last iteration
	iterations    atomic.Int64 // iterations run on this replica
	mootKicks     atomic.Int64 // kicks the waiting loop dropped as moot (tests)

	// Owned by the leading goroutine (and tests driving iterate directly).
	gen int64
	// termStart: when this term took over. Silence before it does not
	// count against an executor (recovery waits a heartbeat timeout into
	// the term): a term ends when the loop loses the database, and the
	// executors could not heartbeat then either.
	termStart    time.Time
	lastActivity time.Time
	lastRecovery time.Time
	nextHookAt   time.Time
	fullOnly     bool // tests: never take the fast path
	// shared: the last iteration found ready work that fair share must
	// share (several orgs, keys or a per-org cap), so the next fast
	// iteration starts fairly (sqlIterateFastNear or sqlIterateFastShared)
	// rather than hand over to the full one.
	shared bool
	// keyed: the last fair fast iteration saw keyed work waiting, so the
	// next one takes the full fair pick (sqlIterateFastShared) rather than
	// the near one, which would only defer to it.
	keyed      bool
	fastStarts int64 // fast iterations that started work (tests)
	// turns: the pool's fair-share ledger, read when the term began
	turns fairTurns
	// handed: the executor capacity reserved for the starts in flight
	// (startArgs; nil: none)
	handed *handoff
	// view: what the planned fair starts assume (plan.go; nil: none);
	// planMisses the planned starts missed in a row, planWait the fair
	// starts left before the next view is read; plannedStarts (tests);
	// reread: a full iteration dropped a view that held, so the next fair
	// start reads one first
	view          *fairView
	planMisses    int
	planWait      int
	plannedStarts int64
	reread        bool
	// completed: the batches this replica recorded since the last planned
	// start, for its view (written by the completer)
	completedMu sync.Mutex
	completed   []completedBatch
}

func newLoop(m *Manager, pool string) *loop {
	return &loop{m: m, pool: pool, kickc: make(chan struct{}, 1), repairc: make(chan struct{}, 1)}
}

// Kinds of kick.
const (
	// kickEnqueue: work was enqueued; dropped while starts are blocked
	// (saturated or paused), since no new work can start then.
	kickEnqueue = iota
	// kickWork: slots were freed, work canceled or settings changed (a
	// resume among them).
	kickWork
)

// kick wakes the loop.
func (l *loop) kick(kind int) {
	if kind == kickEnqueue && l.startsBlocked.Load() {
		return
	}
	if kind == kickWork {
		l.freed.Store(true)
	}
	select {
	case l.kickc <- struct{}{}:
	default:
	}
}

// campaign competes for the pool's leadership until ctx ends.
func (l *loop) campaign(ctx context.Context) {
	e := &leader.Elector{DB: l.m.db, Name: "workpool.loop." + l.pool, Retry: l.m.cfg.LeaderRetry, Logger: l.m.logger}
	e.Run(ctx, l.lead)
}

// lead runs the loop while this replica holds the leadership. Any error
// ends the term (the elector campaigns again), so a new term always starts
// with a takeover that fences out whatever ran before.
func (l *loop) lead(ctx context.Context) {
	log := l.m.logger.With("pool", l.pool)
	if err := l.takeover(ctx); err != nil {
		if ctx.Err() == nil {
			log.Warn("taking over the pool's loop failed", "error", err.Error())
			l.m.metrics.failedAt(stageLoop)
		}
		return
	}
	l.leading.Store(true)
	defer l.leading.Store(false)
	log.Info("leading the pool's loop", "generation", l.gen)
	defer func() {
		// (under its own timeout: a term ends when its context does)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.m.cfg.StatementTimeout)
		defer cancel()
		if err := l.saveTurns(sctx, time.Time{}); err != nil && !errors.Is(err, errGenerationMismatch) {
			log.Warn("saving the fair-share turns at the term's end failed; the next term starts from the last save", "error", err.Error())
		}
	}()
	// (a new term may follow replicas of a version that did not keep the
	// org queues: repair them before the first fair pick reads them)
	if _, err := l.repairQueues(ctx); err != nil {
		if ctx.Err() == nil {
			log.Warn("repairing org queues failed; standing down to retry", "error", err.Error())
			l.m.metrics.failedAt(stageLoop)
		}
		return
	}
	maint, stopMaint := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); l.maintain(maint) }()
	defer func() { stopMaint(); wg.Wait() }()
	for ctx.Err() == nil {
		res, err := l.iterate(ctx)
		switch {
		case errors.Is(err, errGenerationMismatch):
			log.Warn("another loop ran this pool; standing down", "generation", l.gen)
			return
		case err != nil:
			if ctx.Err() == nil {
				log.Warn("loop iteration failed; standing down to retry", "error", err.Error())
				l.m.metrics.failedAt(stageLoop)
			}
			return
		}
		if err := l.saveTurns(ctx, l.m.now()); err != nil {
			if ctx.Err() == nil {
				log.Warn("saving the fair-share turns failed; standing down to retry", "error", err.Error())
				l.m.metrics.failedAt(stageLoop)
			}
			return
		}
		if res.didWork {
			continue
		}
		wakeAt := res.wakeAt
		if l.turns.dirty {
			// (charges not yet saved are saved within turnsSaveEvery, even
			// if the pool goes quiet: a crash loses at most that much)
			if due := l.turns.savedAt.Add(turnsSaveEvery); wakeAt.IsZero() || due.Before(wakeAt) {
				wakeAt = due
			}
		}
		l.wait(ctx, wakeAt)
	}
}

// takeover starts a term: bumping the generation fences out any iteration
// of an earlier leader that is still in flight.
func (l *loop) takeover(ctx context.Context) error {
	// (the bump is not bounded: it waits on the pool row an earlier
	// leader's iteration holds through its hook calls; the read of the
	// turns is, as every statement of the loop that waits on no lock: on
	// a connection gone silent it would wait for good while this replica
	// kept the leadership and nothing of the pool started anywhere)
	if err := l.m.db.QueryRow(ctx, sqlTakeover, l.pool).Scan(&l.gen); err != nil {
		return fmt.Errorf("taking over pool %s: %w", l.pool, err)
	}
	rctx, cancel := context.WithTimeout(ctx, l.m.cfg.StatementTimeout)
	defer cancel()
	if err := l.readTurns(rctx); err != nil {
		return err
	}
	l.lastActivity, l.lastRecovery, l.nextHookAt = time.Time{}, time.Time{}, time.Time{}
	l.view, l.planMisses, l.planWait, l.reread = nil, 0, 0, false
	l.termStart = l.m.now()
	select { // whatever this kick announced, the first iteration will see
	case <-l.kickc:
	default:
	}
	return nil
}

func (l *loop) wait(ctx context.Context, wakeAt time.Time) {
	var timer <-chan time.Time
	if !wakeAt.IsZero() {
		t := time.NewTimer(max(wakeAt.Sub(l.m.now()), 0))
		defer t.Stop()
		timer = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer:
			return
		case <-l.kickc:
			if !l.kickMoot() {
				return
			}
			l.mootKicks.Add(1)
		}
	}
}

// kickMoot says that a kick taken while the loop waits can start nothing:
// an enqueue's (any other kind sets freed), sent while the last iteration
// ran — so not dropped by kick — into a pool that iteration then found
// saturated or paused. The work it announced waits for the kick that
// frees a slot or resumes the pool, as any enqueued later would; without
// this, every iteration of a paused or saturated pool that enqueues
// overlapped was followed by another that found nothing (a full one, its
// outlook reading every org with pending work).
func (l *loop) kickMoot() bool {
	return l.startsBlocked.Load() && !l.freed.Load()
}

// maintain runs the leader's periodic chores: purging finished work and
// idempotency keys past retention, and repairing pending counts and org
// queues — the queues also when an iteration asks (repairc), at most once
// a second.
func (l *loop) maintain(ctx context.Context) {
	every := min(max(l.m.cfg.WorkRetention/100, time.Second), time.Minute)
	purge := time.NewTicker(every)
	defer purge.Stop()
	var lastAsked time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.repairc:
			if time.Since(lastAsked) < time.Second {
				continue
			}
			lastAsked = time.Now()
			var repaired int64
			if !l.chore(ctx, "repairing org queues", func(ctx context.Context) (err error) {
				repaired, err = l.repairQueues(ctx)
				return err
			}) {
				return
			}
			if repaired > 0 {
				l.kick(kickWork) // the work it found may start now
			}
		case <-purge.C:
			for _, c := range []struct {
				what string
				do   func(context.Context) error
			}{
				{"purging finished work", func(ctx context.Context) error { _, err := l.purge(ctx); return err }},
				{"purging idempotency keys", func(ctx context.Context) error { _, err := l.purgeKeys(ctx); return err }},
				{"refreshing pending counts", l.refreshPending},
				{"repairing org queues", func(ctx context.Context) error { _, err := l.repairQueues(ctx); return err }},
			} {
				if !l.chore(ctx, c.what, c.do) {
					return
				}
			}
		}
	}
}

// chore runs one of the leader's chores, logging its failure; false when
// another replica leads now (this term ends with its context).
func (l *loop) chore(ctx context.Context, what string, do func(context.Context) error) bool {
	err := do(ctx)
	if errors.Is(err, leader.ErrDeposed) {
		return false
	}
	if err != nil && ctx.Err() == nil {
		l.m.logger.Warn(what+" failed", "pool", l.pool, "error", err.Error())
		l.m.metrics.failedAt(stageChore)
	}
	return true
}

// purge deletes finished work past retention in bounded batches.
func (l *loop) purge(ctx context.Context) (int64, error) {
	return l.purgeBatches(ctx, sqlPurge, l.m.now().Add(-l.m.cfg.WorkRetention), "finished work")
}

// purgeBatches runs sql, a DELETE of the pool's ($1) rows older than
// cutoff ($2) limited to purgeBatch ($3) rows, until a batch comes back
// short: bounded batches keep each statement's locks and WAL small. Each
// batch is fenced by the leadership's term (the chores are not iterations,
// so the pool's generation does not fence them): a deposed leader's purge
// writes nothing.
func (l *loop) purgeBatches(ctx context.Context, sql string, cutoff time.Time, what string) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		var n int64
		err := leader.FencedTx(ctx, l.m.db, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, sql, l.pool, cutoff, purgeBatch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, fmt.Errorf("purging %s of pool %s: %w", what, l.pool, err)
		}
		total += n
		if n < purgeBatch {
			break
		}
	}
	return total, nil
}

// repairQueues runs sqlRepairQueues, fenced by the leadership's term, and
// says so when it wrote anything (n queues): the queues' writers keep
// them, so a repair means work was made pending by something that did not.
func (l *loop) repairQueues(ctx context.Context) (n int64, err error) {
	// (not bounded: its upsert waits on the org queue rows a record with
	// hooks holds through its hook calls, and it reads every org with
	// pending work)
	err = leader.FencedTx(ctx, l.m.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlRepairQueues, l.pool)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("repairing the org queues of pool %s: %w", l.pool, err)
	}
	if n > 0 {
		l.m.metrics.queueRepairs.WithLabelValues(l.pool).Add(float64(n))
		l.m.logger.Warn("pending work had no org queue (or one whose head was past it): repaired; expected only during a rolling upgrade from a version before the queues",
			"pool", l.pool, "orgs", n)
	}
	return n, nil
}

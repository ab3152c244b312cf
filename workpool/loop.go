package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/leader"
)

const (
	// completionBatch bounds the completions one iteration processes
	// (besides max_parallelism, which bounds what can be outstanding).
	completionBatch = 1000
	// cancelationBatch bounds the cancelations one iteration processes.
	cancelationBatch = 100
	// purgeBatch bounds one retention purge statement.
	purgeBatch = 1000
	// statementTimeout bounds statements whose results must be read even
	// when the caller gives up (claims).
	statementTimeout = 30 * time.Second
	// notifyChunk keeps a cancel notification's id list under Postgres's
	// 8000-byte payload limit.
	notifyChunk = 7000
)

// loop is one pool's main loop on this replica: a leadership candidate
// that, while it leads, runs iterations until it runs out of work, then
// waits for a kick or a timer.
type loop struct {
	m     *Manager
	pool  string
	kickc chan struct{}

	leading    atomic.Bool
	saturated  atomic.Bool  // last published status: enqueue kicks cannot help
	iterations atomic.Int64 // iterations run on this replica

	// Owned by the leading goroutine (and tests driving iterate directly).
	gen          int64
	lastActivity time.Time
	lastRecovery time.Time
	nextHookAt   time.Time

	report loopReport

	relMu    sync.Mutex
	releases []attemptResult // returned handlers of attempts this loop claimed
}

// release queues the slot of an attempt this loop claimed for the local
// executor, to be freed by the next fast iteration in its own statement. It
// refuses (and the executor's release stage takes over) when this replica
// no longer leads the pool. A release that never happens is harmless: the
// result's record then leaves a pending completion that frees the slot.
func (l *loop) release(r attemptResult) bool {
	// Checked under relMu, which the end of a term also takes to stop
	// accepting releases: a result queued here is never left behind.
	l.relMu.Lock()
	if !l.leading.Load() {
		l.relMu.Unlock()
		return false
	}
	l.releases = append(l.releases, r)
	l.relMu.Unlock()
	l.kick(false)
	return true
}

// stopReleases ends the term's releases and returns those not taken.
func (l *loop) stopReleases() []attemptResult {
	l.relMu.Lock()
	defer l.relMu.Unlock()
	l.leading.Store(false)
	rs := l.releases
	l.releases = nil
	return rs
}

func (l *loop) takeReleases() []attemptResult {
	l.relMu.Lock()
	defer l.relMu.Unlock()
	rs := l.releases
	l.releases = nil
	return rs
}

// loopReport counts what the loop processed (the reference's report); the
// minute log prints and resets the "since" copy.
type loopReport struct {
	mu                                                   sync.Mutex
	completed, succeeded, failed, retries, canceled      int64
	sCompleted, sSucceeded, sFailed, sRetries, sCanceled int64
}

func (r *loopReport) add(completed, succeeded, failed, retries, canceled int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.completed += completed
	r.succeeded += succeeded
	r.failed += failed
	r.retries += retries
	r.canceled += canceled
	r.sCompleted += completed
	r.sSucceeded += succeeded
	r.sFailed += failed
	r.sRetries += retries
	r.sCanceled += canceled
}

func newLoop(m *Manager, pool string) *loop {
	return &loop{m: m, pool: pool, kickc: make(chan struct{}, 1)}
}

// kick wakes the loop. An enqueue cannot help a saturated pool, so it is
// dropped then; completions, cancelations and setting changes always wake.
func (l *loop) kick(enqueue bool) {
	if enqueue && l.saturated.Load() {
		return
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
		}
		return
	}
	l.leading.Store(true)
	defer func() {
		// Returned attempts this term did not get to: recorded without a
		// release, they free their slots through pending completions.
		l.m.exec.rep.finish.addAll(l.stopReleases())
	}()
	log.Info("leading the pool's loop", "generation", l.gen)
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
			}
			return
		case res.didWork:
			continue
		}
		l.wait(ctx, res.wakeAt)
	}
}

// takeover starts a term: bumping the generation fences out any iteration
// of an earlier leader that is still in flight.
func (l *loop) takeover(ctx context.Context) error {
	if err := l.m.db.QueryRow(ctx, sqlTakeover, l.pool).Scan(&l.gen); err != nil {
		return fmt.Errorf("taking over pool %s: %w", l.pool, err)
	}
	l.lastActivity, l.lastRecovery, l.nextHookAt = time.Time{}, time.Time{}, time.Time{}
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
	select {
	case <-ctx.Done():
	case <-l.kickc:
	case <-timer:
	}
}

// iterResult is what an iteration tells the loop: loop again at once, or
// wait for a kick or wakeAt (zero: no timer).
type iterResult struct {
	didWork bool
	wakeAt  time.Time
	status  RunStatus
	clean   bool // (fast path) nothing it could not handle was waiting
}

// iteration is one iteration's transaction and what it found.
type iteration struct {
	l        *loop
	tx       pgx.Tx
	now      time.Time
	gen      int64 // the generation this iteration writes
	maxPar   int
	perOrg   *int32
	needSync bool // it finished work or ran hooks: commit durably
	plain    bool // one org, no keys, no cap: start without fair share
	cancels  []uuid.UUID
	started  int
}

// iterate runs one iteration: the one-statement fast path when nothing
// but freeing slots and starting one org's plain work is due, else (or
// when the fast path left something) the full iteration.
func (l *loop) iterate(ctx context.Context) (iterResult, error) {
	t0 := time.Now()
	l.iterations.Add(1)
	defer func() { l.m.metrics.iteration.WithLabelValues(l.pool).Observe(time.Since(t0).Seconds()) }()
	now := l.m.now()
	recoveryDue := now.Sub(l.lastRecovery) >= l.m.cfg.RecoveryPeriod
	hooksDue := !l.nextHookAt.IsZero() && !now.Before(l.nextHookAt)
	if !recoveryDue && !hooksDue {
		fast, done, err := l.iterateFast(ctx, now)
		if err != nil || done {
			return fast, err
		}
		if !fast.didWork && fast.clean && now.Sub(l.lastActivity) < l.m.cfg.Cooldown {
			// Nothing new (a kick whose completions an earlier iteration
			// took): still "running" through the cooldown, so there is no
			// status to publish; wake at its end to decide one.
			return iterResult{status: RunStatus{Kind: "running"}, wakeAt: l.lastActivity.Add(l.m.cfg.Cooldown)}, nil
		}
		res, err := l.iterateFull(ctx)
		res.didWork = res.didWork || fast.didWork
		return res, err
	}
	return l.iterateFull(ctx)
}

// iterateFast runs sqlIterateFast. done is false when the full iteration
// must follow: it found a retry or cancelation to process, ready work that
// needs fair share, or nothing at all (the full iteration then publishes
// the run status).
func (l *loop) iterateFast(ctx context.Context, now time.Time) (res iterResult, done bool, err error) {
	var (
		fenced, plain, retries, cancels bool
		succeeded, failed, canceled     int64
		notified                        int64
		lags                            []float64
		ids                             []uuid.UUID
		orgs, handlers, args            []string
		attempts, timeouts              []int32
		hooks                           []bool
	)
	e := l.m.exec
	names, free, share := e.handoff()
	rels := l.takeReleases()
	relIDs, relAttempts, relKinds, relRetryable := releaseArgs(rels)
	b := &pgx.Batch{}
	// Losing this commit in a crash loses only starts (made again) and
	// slot releases (their completions come back): nothing promised.
	b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
	b.Queue(sqlIterateFast, l.pool, l.gen, now, completionBatch, "s:"+l.pool+"@"+l.m.origin,
		names, int32(free), share, [16]byte(e.id), relIDs, relAttempts, relKinds, relRetryable).QueryRow(func(r pgx.Row) error {
		return r.Scan(&fenced, &plain, &succeeded, &failed, &canceled, &lags, &retries, &cancels, &notified,
			&ids, &orgs, &handlers, &args, &attempts, &timeouts, &hooks)
	})
	// Not canceled with the leadership: once sent, the statement's result
	// must be read, or the work it handed to this executor would sit claimed
	// and unrun until recovery. (A stale statement writes nothing anyway.)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statementTimeout)
	defer cancel()
	err = l.m.db.SendBatch(sctx, b).Close()
	// The results go to be recorded only now, so that recording them never
	// holds the rows this statement releases (its row locks would make the
	// release skip them). Recording reads whether the slot was released.
	e.rep.finish.addAll(rels)
	if err != nil {
		return iterResult{}, false, fmt.Errorf("fast iteration: %w", err)
	}
	if !fenced {
		return iterResult{}, false, fmt.Errorf("pool %s at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	}
	l.gen++
	if len(ids) > 0 {
		jobs := make([]claimedJob, len(ids))
		for i := range ids {
			jobs[i] = claimedJob{Job: Job{ID: ids[i], OrgID: orgs[i], Pool: l.pool, Handler: handlers[i],
				Args: json.RawMessage(args[i]), Attempt: int(attempts[i]) + 1},
				timeout: time.Duration(timeouts[i]) * time.Millisecond, hook: hooks[i]}
		}
		e.adopt(l, jobs)
	}
	met := l.m.metrics
	completed := succeeded + failed + canceled
	l.report.add(completed, succeeded, failed, 0, canceled)
	met.succeeded.WithLabelValues(l.pool).Add(float64(succeeded))
	met.failed.WithLabelValues(l.pool).Add(float64(failed))
	met.canceled.WithLabelValues(l.pool).Add(float64(canceled))
	if len(lags) > 0 {
		met.started.WithLabelValues(l.pool).Add(float64(len(lags)))
		lag := met.startLag.WithLabelValues(l.pool)
		for _, s := range lags {
			lag.Observe(max(s, 0))
		}
		if len(lags) > len(ids) {
			e.kick() // work for any executor, this one included
		}
	}
	didWork := completed > 0 || len(lags) > 0
	if didWork {
		l.lastActivity = now
		l.saturated.Store(false)
	}
	clean := plain && !retries && !cancels
	return iterResult{didWork: didWork, clean: clean, status: RunStatus{Kind: "running"}}, didWork && clean, nil
}

// iterateFull runs one iteration in one transaction: completions, then
// cancelations, then recovery and hook retries, then starts; when it found
// nothing to do it publishes the run status and says when to wake.
func (l *loop) iterateFull(ctx context.Context) (iterResult, error) {
	tx, err := l.m.db.Begin(ctx)
	if err != nil {
		return iterResult{}, fmt.Errorf("begin iteration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	it := &iteration{l: l, tx: tx, now: l.m.now(), gen: l.gen + 1}
	ctx, actions := withCommitActions(ctx)
	completions, cancels, err := it.open(ctx)
	if err != nil {
		return iterResult{}, err
	}
	if err := it.completions(ctx, completions); err != nil {
		return iterResult{}, err
	}
	if err := it.cancelations(ctx, cancels); err != nil {
		return iterResult{}, err
	}
	recovered, err := it.recover(ctx)
	if err != nil {
		return iterResult{}, err
	}
	if err := it.start(ctx); err != nil {
		return iterResult{}, err
	}
	res := iterResult{didWork: len(completions) > 0 || len(cancels) > 0 || recovered > 0 || it.started > 0}
	if res.didWork {
		res.status = RunStatus{Kind: "running"}
		l.lastActivity = it.now
	} else if res, err = it.outlook(ctx); err != nil {
		return iterResult{}, err
	}
	if !it.needSync {
		// Losing this commit in a crash loses only starts (re-made), slot
		// releases and retry scheduling (whose completions come back):
		// nothing anyone was promised. Finishing work and hooks commit durably.
		if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', 'off', true)"); err != nil {
			return iterResult{}, fmt.Errorf("iteration commit mode: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return iterResult{}, fmt.Errorf("commit iteration: %w", err)
	}
	l.gen = it.gen
	actions.run()
	l.saturated.Store(res.status.Kind == "scheduled" && res.status.Saturated)
	if it.started > 0 {
		l.m.exec.kick()
	}
	if len(it.cancels) > 0 {
		l.m.exec.cancelJobs(it.cancels)
	}
	return res, nil
}

// open fences the iteration and takes the pending completions and
// cancelations, in one round trip.
func (it *iteration) open(ctx context.Context) ([]pendingCompletion, []uuid.UUID, error) {
	l := it.l
	b := &pgx.Batch{}
	b.Queue(sqlBump, l.pool, l.gen, it.now)
	b.Queue(sqlTakeCompletions, l.pool, completionBatch)
	b.Queue(sqlTakeCancelations, l.pool, cancelationBatch)
	b.Queue(sqlCensus, l.pool, it.now)
	br := it.tx.SendBatch(ctx, b)
	defer br.Close()
	var maxPar int32
	if err := br.QueryRow().Scan(&maxPar, &it.perOrg); errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("pool %s at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	} else if err != nil {
		return nil, nil, fmt.Errorf("opening iteration: %w", err)
	}
	it.maxPar = int(maxPar)
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("taking completions: %w", err)
	}
	completions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingCompletion, error) {
		var c pendingCompletion
		err := r.Scan(&c.workID, &c.attempt, &c.outcome, &c.retry)
		return c, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("taking completions: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("taking cancelations: %w", err)
	}
	cancels, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, nil, fmt.Errorf("taking cancelations: %w", err)
	}
	var orgs int
	var keyed bool
	if err := br.QueryRow().Scan(&orgs, &keyed); err != nil {
		return nil, nil, fmt.Errorf("counting orgs with ready work: %w", err)
	}
	// Fair share has nothing to share with one org, no keys and no cap:
	// the plain start is then the same choice, at a fraction of the cost.
	it.plain = orgs <= 1 && !keyed && it.perOrg == nil
	return completions, cancels, nil
}

type pendingCompletion struct {
	workID  uuid.UUID
	attempt int32
	outcome string
	retry   bool
}

// completions frees the slots of finished attempts and schedules retries,
// except for work canceled meanwhile, which finishes as canceled.
func (it *iteration) completions(ctx context.Context, cs []pendingCompletion) error {
	if len(cs) == 0 {
		return nil
	}
	var ids []uuid.UUID
	var attempts []int32
	var completed, succeeded, failed, canceled int64
	for _, c := range cs {
		if c.retry {
			ids, attempts = append(ids, c.workID), append(attempts, c.attempt)
			continue
		}
		completed++
		switch Outcome(c.outcome) {
		case OutcomeSucceeded:
			succeeded++
		case OutcomeFailed:
			failed++
		case OutcomeCanceled:
			canceled++
		}
	}
	var retried int64
	if len(ids) > 0 {
		rows, err := it.tx.Query(ctx, sqlRetry, pgUUIDs(ids), attempts, it.now)
		if err != nil {
			return fmt.Errorf("scheduling retries: %w", err)
		}
		again, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("scheduling retries: %w", err)
		}
		retried = int64(len(again))
		if len(again) < len(ids) {
			// Canceled while its failure waited here: cancel wins.
			n, err := it.finishCanceled(ctx, without(ids, again))
			if err != nil {
				return err
			}
			canceled += n
			completed += n
		}
	}
	it.l.report.add(completed, succeeded, failed, retried, canceled)
	met := it.l.m.metrics
	met.succeeded.WithLabelValues(it.l.pool).Add(float64(succeeded))
	met.failed.WithLabelValues(it.l.pool).Add(float64(failed))
	met.canceled.WithLabelValues(it.l.pool).Add(float64(canceled))
	met.retried.WithLabelValues(it.l.pool).Add(float64(retried))
	return nil
}

// finishCanceled finishes canceled work that is not running, runs its
// hooks, and returns how many finished.
func (it *iteration) finishCanceled(ctx context.Context, ids []uuid.UUID) (int64, error) {
	rows, err := it.tx.Query(ctx, sqlFinishCanceled, pgUUIDs(ids), it.now)
	if err != nil {
		return 0, fmt.Errorf("finishing canceled work: %w", err)
	}
	done, err := scanFinished(rows)
	if err != nil {
		return 0, fmt.Errorf("finishing canceled work: %w", err)
	}
	if len(done) == 0 {
		return 0, nil
	}
	it.needSync = true
	if err := it.l.m.runHooks(ctx, it.tx, hookCalls(done), false, false); err != nil {
		return 0, err
	}
	return int64(len(done)), nil
}

// cancelations marks work canceled so it never retries; work that is not
// running finishes now, running work is told to stop (its executor reports
// the attempt, which then finishes as canceled).
func (it *iteration) cancelations(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := it.tx.Query(ctx, sqlMarkCanceled, pgUUIDs(ids))
	if err != nil {
		return fmt.Errorf("marking work canceled: %w", err)
	}
	type marked struct {
		id    uuid.UUID
		state string
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (marked, error) {
		var m marked
		err := r.Scan(&m.id, &m.state)
		return m, err
	})
	if err != nil {
		return fmt.Errorf("marking work canceled: %w", err)
	}
	var idle, running []uuid.UUID
	for _, m := range ms {
		switch m.state {
		case "pending", "retrying":
			idle = append(idle, m.id)
		case "running":
			running = append(running, m.id)
		}
	}
	n, err := it.finishCanceled(ctx, idle)
	if err != nil {
		return err
	}
	it.l.report.add(n, 0, 0, 0, n)
	it.l.m.metrics.canceled.WithLabelValues(it.l.pool).Add(float64(n))
	if len(running) > 0 {
		for _, payload := range cancelPayloads(running, it.l.m.origin) {
			if _, err := it.tx.Exec(ctx, sqlNotify, payload); err != nil {
				return fmt.Errorf("notifying cancelations: %w", err)
			}
		}
		it.cancels = running
	}
	return nil
}

// cancelPayloads packs ids into "x:id,id,…@origin" notifications.
func cancelPayloads(ids []uuid.UUID, origin string) []string {
	var out []string
	var b strings.Builder
	for _, id := range ids {
		if b.Len() > 0 && b.Len()+37 > notifyChunk {
			out = append(out, "x:"+b.String()+"@"+origin)
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id.String())
	}
	if b.Len() > 0 {
		out = append(out, "x:"+b.String()+"@"+origin)
	}
	return out
}

// recover, every RecoveryPeriod, counts attempts whose executor went silent
// as failed (retried per policy), and retries due hook calls.
func (it *iteration) recover(ctx context.Context) (int, error) {
	l := it.l
	due := it.now.Sub(l.lastRecovery) >= l.m.cfg.RecoveryPeriod
	hooksDue := !l.nextHookAt.IsZero() && !it.now.Before(l.nextHookAt)
	if !due && !hooksDue {
		return 0, nil
	}
	n := 0
	if due {
		l.lastRecovery = it.now
		stale, err := it.stale(ctx)
		if err != nil {
			return 0, err
		}
		if len(stale) > 0 {
			it.needSync = true
			if _, err := l.m.completeTx(ctx, it.tx, stale); err != nil {
				return 0, fmt.Errorf("recovering stale work: %w", err)
			}
			l.m.logger.Warn("recovered work whose executor went silent", "pool", l.pool, "count", len(stale))
		}
		n += len(stale)
	}
	l.nextHookAt = time.Time{}
	retried, err := it.retryHooks(ctx)
	if err != nil {
		return 0, err
	}
	return n + retried, nil
}

func (it *iteration) stale(ctx context.Context) ([]attemptResult, error) {
	rows, err := it.tx.Query(ctx, sqlStale, it.l.pool, it.now.Add(-it.l.m.cfg.HeartbeatTimeout))
	if err != nil {
		return nil, fmt.Errorf("finding stale work: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (attemptResult, error) {
		var (
			id        uuid.UUID
			attempts  int32
			unclaimed bool
		)
		if err := r.Scan(&id, &attempts, &unclaimed); err != nil {
			return attemptResult{}, err
		}
		msg := "the executor running this attempt stopped heartbeating"
		if unclaimed {
			msg = "no executor claimed this attempt in time"
		}
		return attemptResult{id: id, pool: it.l.pool, attempt: int(attempts) + 1, err: msg, retryable: true}, nil
	})
}

// retryHooks reruns failed hook calls whose backoff has passed.
func (it *iteration) retryHooks(ctx context.Context) (int, error) {
	rows, err := it.tx.Query(ctx, sqlDueHooks, it.l.pool, it.now)
	if err != nil {
		return 0, fmt.Errorf("finding hook retries: %w", err)
	}
	calls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (hookCall, error) {
		var (
			f        finishedRow
			attempts int32
		)
		err := r.Scan(&f.id, &f.orgID, &f.pool, &f.handler, &f.state, &f.outcome, &f.result, &f.errText, &f.attempts,
			&f.hook, &f.hookCtx, &attempts)
		if err != nil {
			return hookCall{}, err
		}
		c := hookCalls([]finishedRow{f})
		if len(c) == 0 {
			return hookCall{}, fmt.Errorf("work %s waits for a hook retry but has no hook", f.id)
		}
		c[0].attempts = int(attempts)
		return c[0], nil
	})
	if err != nil {
		return 0, fmt.Errorf("finding hook retries: %w", err)
	}
	if len(calls) == 0 {
		return 0, nil
	}
	it.needSync = true
	it.l.m.metrics.hookRetries.WithLabelValues(it.l.pool).Add(float64(len(calls)))
	if err := it.l.m.runHooks(ctx, it.tx, calls, true, false); err != nil {
		return 0, err
	}
	return len(calls), nil
}

// start fills free slots with ready work and tells the executors.
func (it *iteration) start(ctx context.Context) error {
	l := it.l
	var (
		rows pgx.Rows
		err  error
	)
	if it.plain {
		rows, err = it.tx.Query(ctx, sqlStartPlain, l.pool, int32(it.maxPar), it.now)
	} else {
		rows, err = it.tx.Query(ctx, sqlStart, l.pool, int32(it.maxPar), it.now, it.perOrg)
	}
	if err != nil {
		return fmt.Errorf("starting work: %w", err)
	}
	lag := l.m.metrics.startLag.WithLabelValues(l.pool)
	for rows.Next() {
		var (
			id    uuid.UUID
			runAt time.Time
		)
		if err := rows.Scan(&id, &runAt); err != nil {
			rows.Close()
			return fmt.Errorf("starting work: %w", err)
		}
		lag.Observe(max(it.now.Sub(runAt), 0).Seconds())
		it.started++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("starting work: %w", err)
	}
	if it.started == 0 {
		return nil
	}
	l.m.metrics.started.WithLabelValues(l.pool).Add(float64(it.started))
	if _, err := it.tx.Exec(ctx, sqlNotify, "s:"+l.pool+"@"+l.m.origin); err != nil {
		return fmt.Errorf("notifying executors: %w", err)
	}
	return nil
}

// outlook decides, when an iteration found nothing to do, what the loop
// publishes and when it must wake by itself: it stays "running" through
// the cooldown; goes "scheduled" while slots are in use or work waits for
// its run_at (waking for the earliest start, the next recovery, or a hook
// retry); and goes "idle" when nothing remains — only a kick wakes it then.
func (it *iteration) outlook(ctx context.Context) (iterResult, error) {
	l := it.l
	var (
		used              int64
		ready, cancelling bool
		nextRun, nextHook *time.Time
	)
	if err := it.tx.QueryRow(ctx, sqlOutlook, l.pool, it.now).Scan(&used, &ready, &nextRun, &nextHook, &cancelling); err != nil {
		return iterResult{}, fmt.Errorf("reading the pool's outlook: %w", err)
	}
	if cancelling {
		// A cancelation committed after this iteration took its batch.
		return iterResult{didWork: true, status: RunStatus{Kind: "running"}}, nil
	}
	if nextHook != nil {
		l.nextHookAt = *nextHook
	}
	wake := earliest(nextRun, nextHook)
	if used > 0 {
		wake = earliest(wake, ptr(l.lastRecovery.Add(l.m.cfg.RecoveryPeriod)))
	}
	if ready && used == 0 {
		// Ready work that did not start although nothing runs: no cap or
		// key can hold it back, so its row was locked; look again shortly.
		// (Work held back by its org's cap or its key while slots are in
		// use starts when a completion kicks the loop.)
		wake = earliest(wake, ptr(it.now.Add(100*time.Millisecond)))
	}
	var st RunStatus
	switch {
	case it.now.Sub(l.lastActivity) < l.m.cfg.Cooldown:
		st = RunStatus{Kind: "running"}
		wake = earliest(wake, ptr(l.lastActivity.Add(l.m.cfg.Cooldown)))
	case used > 0 || nextRun != nil || ready || nextHook != nil:
		st = RunStatus{Kind: "scheduled", Saturated: used >= int64(it.maxPar)}
		if wake != nil {
			at := *wake
			st.At = &at
		}
	default:
		st = RunStatus{Kind: "idle"}
	}
	if st.Kind != "running" {
		if _, err := it.tx.Exec(ctx, sqlSetRunStatus, l.pool, it.gen, st.Kind, st.Saturated, st.At, it.now); err != nil {
			return iterResult{}, fmt.Errorf("publishing run status: %w", err)
		}
	}
	res := iterResult{status: st}
	if wake != nil {
		res.wakeAt = *wake
	}
	return res, nil
}

// maintain runs the leader's periodic chores: purging finished work past
// retention, and the minute report.
func (l *loop) maintain(ctx context.Context) {
	every := min(max(l.m.cfg.WorkRetention/100, time.Second), time.Minute)
	purge := time.NewTicker(every)
	defer purge.Stop()
	report := time.NewTicker(time.Minute)
	defer report.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-purge.C:
			if _, err := l.purge(ctx); err != nil && ctx.Err() == nil {
				l.m.logger.Warn("purging finished work failed", "pool", l.pool, "error", err.Error())
			}
			if _, err := l.purgeKeys(ctx); err != nil && ctx.Err() == nil {
				l.m.logger.Warn("purging idempotency keys failed", "pool", l.pool, "error", err.Error())
			}
			if err := l.refreshPending(ctx); err != nil && ctx.Err() == nil {
				l.m.logger.Warn("refreshing pending counts failed", "pool", l.pool, "error", err.Error())
			}
		case <-report.C:
			l.logReport()
		}
	}
}

// purge deletes finished work past retention in bounded batches.
func (l *loop) purge(ctx context.Context) (int64, error) {
	return l.purgeBatches(ctx, sqlPurge, l.m.now().Add(-l.m.cfg.WorkRetention), "finished work")
}

// purgeBatches runs sql, a DELETE of the pool's ($1) rows older than
// cutoff ($2) limited to purgeBatch ($3) rows, until a batch comes back
// short: bounded batches keep each statement's locks and WAL small.
func (l *loop) purgeBatches(ctx context.Context, sql string, cutoff time.Time, what string) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		tag, err := l.m.db.Exec(ctx, sql, l.pool, cutoff, purgeBatch)
		if err != nil {
			return total, fmt.Errorf("purging %s of pool %s: %w", what, l.pool, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			break
		}
	}
	return total, nil
}

func (l *loop) logReport() {
	r := &l.report
	r.mu.Lock()
	c, s, f, rt, cn := r.sCompleted, r.sSucceeded, r.sFailed, r.sRetries, r.sCanceled
	r.sCompleted, r.sSucceeded, r.sFailed, r.sRetries, r.sCanceled = 0, 0, 0, 0, 0
	r.mu.Unlock()
	if c+rt+cn == 0 {
		return
	}
	l.m.logger.Info("pool report", "pool", l.pool, "completed", c, "succeeded", s, "failed", f, "retries", rt, "canceled", cn)
}

func earliest(a, b *time.Time) *time.Time {
	switch {
	case a == nil:
		return b
	case b == nil, a.Before(*b):
		return a
	}
	return b
}

func ptr[T any](v T) *T { return &v }

// without returns the ids of all that are not in some.
func without(all, some []uuid.UUID) []uuid.UUID {
	skip := make(map[uuid.UUID]bool, len(some))
	for _, id := range some {
		skip[id] = true
	}
	var out []uuid.UUID
	for _, id := range all {
		if !skip[id] {
			out = append(out, id)
		}
	}
	return out
}

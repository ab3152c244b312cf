package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
)

// iterResult is what an iteration tells the loop: loop again at once, or
// wait for a kick or wakeAt (zero: no timer).
type iterResult struct {
	didWork bool
	wakeAt  time.Time
	status  RunStatus
	clean   bool // (fast path) nothing it could not handle was waiting
	plain   bool // (fast path) the ready work was one org's plain work (or none)
	filled  bool // (fast path) it started work into every free slot
	// unseen: (fast path) work may wait whose next start it did not see
	// (another org's, keyed work): its wakeAt may be late for it
	unseen bool
}

// iterate runs one iteration: the one-statement fast path (fast.go) when
// nothing but starting one org's plain work is due, else (or when the fast
// path left something) the full iteration.
func (l *loop) iterate(ctx context.Context) (iterResult, error) {
	t0 := time.Now()
	l.iterations.Add(1)
	defer l.releaseHandoff() // an iteration that failed before its launch
	defer func() { l.m.metrics.iteration.WithLabelValues(l.pool).Observe(time.Since(t0).Seconds()) }()
	// Whatever this iteration publishes, it reads the tables first: an
	// enqueue that commits after its reads must wake the loop again, or the
	// pool could publish "idle" (or a paused pool never say that work
	// waits) and sleep on work it never saw. Only the published status of
	// an iteration that saw the work may drop enqueue kicks again.
	l.startsBlocked.Store(false)
	// A kick sent before this iteration reads announced a change committed
	// before it reads (every kick follows its commit): it has nothing more
	// to say. Left in the channel, it would wake the loop for an iteration
	// that finds nothing — after each start of a busy pool, since the
	// completions that kick it land while the start runs.
	select {
	case <-l.kickc:
	default:
	}
	now := l.m.now()
	if l.freed.Swap(false) {
		// Slots were freed or work canceled since the last iteration: the
		// pool was busy, so it stays "running" through the cooldown.
		l.lastActivity = now
	}
	recoveryDue := now.Sub(l.lastRecovery) >= l.m.cfg.RecoveryPeriod
	hooksDue := !l.nextHookAt.IsZero() && !now.Before(l.nextHookAt)
	if recoveryDue || hooksDue || l.fullOnly {
		return l.iterateFull(ctx)
	}
	fast, err := l.iterateFast(ctx, now)
	if err == nil {
		l.shared = !fast.plain
	}
	if err != nil || (fast.didWork && fast.clean && !fast.filled) {
		return fast, err
	}
	// Within the cooldown, an iteration that found nothing waits — unless
	// work waits whose next start it did not see (the plain statement sees
	// only the first org's plain work): then the full iteration's outlook
	// finds it, or a retry of another org, or keyed, due before the
	// cooldown's end would wait for the end.
	if fast.clean && (fast.filled || !fast.didWork && !fast.unseen && !l.paused.Load() && now.Sub(l.lastActivity) < l.m.cfg.Cooldown) {
		// Nothing new, or every free slot just taken (nothing more can
		// start until a slot frees, and whatever frees one kicks the
		// loop): still "running" through the cooldown, so there is no
		// status to publish; wake at its end to decide one, or sooner for
		// work due before it (a retry the completer scheduled).
		wake := l.lastActivity.Add(l.m.cfg.Cooldown)
		if !fast.wakeAt.IsZero() && fast.wakeAt.Before(wake) {
			wake = fast.wakeAt
		}
		return iterResult{status: RunStatus{Kind: "running"}, wakeAt: wake}, nil
	}
	res, err := l.iterateFull(ctx)
	res.didWork = res.didWork || fast.didWork
	return res, err
}

// iteration is one full iteration's transaction and what it found.
type iteration struct {
	l  *loop
	tx pgx.Tx // each round trip bounded (roundTripBound)
	// locking is tx unbounded, for the statements that may wait on rows
	// another transaction holds (marking work canceled, recording the
	// attempts it recovers): a record with hooks holds them for as long as
	// its hook calls take.
	locking  pgx.Tx
	now      time.Time
	gen      int64 // the generation this iteration writes
	maxPar   int
	perOrg   *int32
	paused   bool // the pool is paused: start nothing
	needSync bool // it finished work or ran hooks: commit durably
	plain    bool // one org, no keys, no cap: start without fair share
	cancels  []uuid.UUID
	// besideCancels: it took a full batch of cancelations, so more may
	// wait (the start passes over their work)
	besideCancels bool
	started       startedWork
	charges       turnCharges // the fair start's, entered in the loop's turns once committed
	// hookUntil: the iteration's calls of hooks — of canceled and recovered
	// work, and retries — begin before it (hookBudget)
	hookUntil time.Time
}

// hookBudget is when the iteration stops calling hooks: a hook timeout
// after its first call. It holds the pool row, and every org's starts wait
// while it calls them: the calls it does not make are left due, for the
// next iteration.
func (it *iteration) hookBudget() time.Time {
	if it.hookUntil.IsZero() {
		it.hookUntil = time.Now().Add(it.l.m.cfg.HookTimeout)
	}
	return it.hookUntil
}

// iterateFull runs one iteration in one transaction: cancelations, then
// recovery and hook retries, then starts; when it found nothing to do it
// publishes the run status and says when to wake.
func (l *loop) iterateFull(ctx context.Context) (iterResult, error) {
	// Its round trips are bounded, but for those that may wait on another
	// transaction's locks (iteration.locking): on a pooled connection gone
	// silent (a hung proxy; the dialer's TCP bounds catch a network that
	// dropped it) one would wait for the kernel, while this replica kept
	// the leadership and nothing of the pool started. The first ones by
	// the statement timeout; the rest by roundTripBound. (Not the
	// iteration as a whole: the hook calls it makes may take long, and one
	// cut there would be cut at the same place on every try.)
	// (it may cancel, recover and record, which the view would not know;
	// and its pick reads each org from its queue's head) A view that held
	// is read again at the next fair start, before it picks: the backlog
	// it planned is most likely still there (a recovery comes due every
	// RecoveryPeriod in the middle of one), and the near and full picks
	// that would otherwise start it, then read the view, cost 15–40 ms.
	// (Until a fair start reads it, or the pool goes idle: a full
	// iteration right after this one finds no view to drop.)
	l.reread = l.reread || l.view != nil
	l.dropView(ctx)
	octx, cancelOpen := context.WithTimeout(ctx, l.m.cfg.StatementTimeout)
	defer cancelOpen()
	begun, err := l.m.db.Begin(octx)
	if err != nil {
		return iterResult{}, fmt.Errorf("begin iteration: %w", err)
	}
	tx := db.BoundRoundTrips(begun, l.m.roundTripBound())
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	it := &iteration{l: l, tx: tx, locking: begun, now: l.m.now(), gen: l.gen + 1}
	ctx, actions := db.WithAfterCommit(ctx)
	cancels, err := it.open(octx)
	if err != nil {
		return iterResult{}, err
	}
	cancelOpen()
	if err := it.cancelations(ctx, cancels); err != nil {
		return iterResult{}, err
	}
	recovered, err := it.recover(ctx)
	if err != nil {
		return iterResult{}, err
	}
	if !it.hookUntil.IsZero() && !time.Now().Before(it.hookUntil) {
		// Its hook budget ran out: the calls it did not make wait in the
		// retry queue, due now, and the next iteration — a full one —
		// makes them (the fast path reads no hook retries).
		l.nextHookAt = it.now
	}
	// Cancelations go first, and the start fills the free slots even when
	// the batch was full: one org's CancelAll of a backlog must not hold up
	// every org's starts until the last of its batches. More cancelations
	// may wait then, perhaps for the very items the start would pick, so
	// that start passes over work with a cancelation waiting.
	it.besideCancels = len(cancels) == cancelationBatch
	if err := it.start(ctx); err != nil {
		return iterResult{}, err
	}
	res := iterResult{didWork: len(cancels) > 0 || recovered > 0 || len(it.started.lags) > 0}
	if res.didWork {
		res.status = RunStatus{Kind: "running"}
		l.lastActivity = it.now
	} else if res, err = it.outlook(ctx); err != nil {
		return iterResult{}, err
	} else if res.status.Kind == "idle" {
		// A new backlog gets a fresh start at planning its fair starts.
		l.planMisses, l.planWait, l.reread = 0, 0, false
	}
	if it.needSync {
		// It finished work or ran hooks: commit durably (open turned
		// durability off for the common iteration, which only starts).
		if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', 'on', true)"); err != nil {
			return iterResult{}, fmt.Errorf("iteration commit mode: %w", err)
		}
	}
	// Committed under its own timeout, not the leadership's context (as
	// the fast path's statement): a commit cut off by the leadership's end
	// may land all the same, and the work it handed to this executor would
	// then sit claimed and unrun until the heartbeat timeout recovered it.
	l.m.exec.claiming.RLock() // until its claims are launched
	defer l.m.exec.claiming.RUnlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.m.cfg.StatementTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		l.m.exec.claimLost()
		return iterResult{}, fmt.Errorf("commit iteration: %w", err)
	}
	l.gen = it.gen
	l.turns.apply(it.charges)
	l.paused.Store(it.paused)
	l.shared = !it.plain
	actions.Run()
	l.startsBlocked.Store(res.status.Kind == "scheduled" && (res.status.Saturated || it.paused))
	// Only now that the starts are committed may this replica's share run.
	l.launch(it.started)
	if len(it.cancels) > 0 {
		l.m.exec.cancelJobs(it.cancels)
	}
	return res, nil
}

// open fences the iteration and takes the pending cancelations, in one
// round trip. It also commits the iteration without waiting for the WAL
// flush, which iterateFull undoes when the iteration finished work or ran
// hooks: losing the commit of an iteration that only started work loses
// only starts (made again), nothing anyone was promised. And it bounds the
// transaction's idle time, as a leader's fenced write does: the
// transaction holds the pool row, and a leader lost in its middle (its
// node gone, a partition) would leave it open on the server, the next
// leader's takeover waiting on that row until TCP gave up on the peer.
func (it *iteration) open(ctx context.Context) ([]uuid.UUID, error) {
	l := it.l
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('synchronous_commit', 'off', true), set_config('idle_in_transaction_session_timeout', $1, true)",
		strconv.FormatInt(l.m.idleLimitWithHooks().Milliseconds(), 10))
	b.Queue(sqlBump, l.pool, l.gen, it.now)
	b.Queue(sqlTakeCancelations, l.pool, cancelationBatch)
	b.Queue(sqlCensus, l.pool, it.now)
	br := it.tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("iteration commit mode: %w", err)
	}
	var (
		maxPar   int32
		settings int64 // (the full iteration's later statements read the settings as they are)
	)
	if err := br.QueryRow().Scan(&maxPar, &it.perOrg, &it.paused, &settings); errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pool %s at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	} else if err != nil {
		return nil, fmt.Errorf("opening iteration: %w", err)
	}
	it.maxPar = int(maxPar)
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("taking cancelations: %w", err)
	}
	cancels, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("taking cancelations: %w", err)
	}
	var orgs int
	var keyed bool
	if err := br.QueryRow().Scan(&orgs, &keyed); err != nil {
		return nil, fmt.Errorf("counting orgs with ready work: %w", err)
	}
	// Fair share has nothing to share with one org, no keys and no cap:
	// the plain start is then the same choice, at a fraction of the cost.
	it.plain = orgs <= 1 && !keyed && it.perOrg == nil
	return cancels, nil
}

// finishCanceled finishes canceled work that is not running and runs its
// hooks.
func (it *iteration) finishCanceled(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := it.locking.Query(ctx, sqlFinishCanceled, pgUUIDs(ids), it.now)
	if err != nil {
		return fmt.Errorf("finishing canceled work: %w", err)
	}
	done, err := scanFinished(rows)
	if err != nil {
		return fmt.Errorf("finishing canceled work: %w", err)
	}
	if len(done) == 0 {
		return nil
	}
	it.needSync = true
	rep := it.l.m.report(it.l.pool)
	db.CountAfterCommit(ctx, func() { // (rolled back, nothing was canceled)
		for range done {
			rep.finished(OutcomeCanceled)
		}
	})
	_, err = it.l.m.runHooks(ctx, it.tx, hookCalls(done), false, false, it.hookBudget())
	return err
}

// cancelations marks work canceled so it never runs again; work that is
// not running finishes now, running work is told to stop (its executor
// reports the attempt, which then finishes as canceled).
func (it *iteration) cancelations(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := it.locking.Query(ctx, sqlMarkCanceled, pgUUIDs(ids))
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
		case "pending":
			idle = append(idle, m.id)
		case "running":
			running = append(running, m.id)
		}
	}
	if err := it.finishCanceled(ctx, idle); err != nil {
		return err
	}
	if len(running) > 0 {
		for _, payload := range cancelPayloads(running, it.l.m.origin) {
			if _, err := it.tx.Exec(ctx, sqlNotify, payload); err != nil {
				return fmt.Errorf("notifying cancelations: %w", err)
			}
		}
		it.cancels = running
		// The executors stop these once it commits: a commit a crash lost
		// would leave the work uncanceled, its stopped attempt then
		// recorded as failed.
		it.needSync = true
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

// recover, every RecoveryPeriod, records attempts whose executor went
// silent as failed (retried per policy), and retries due hook calls.
//
// Silence counts only within the term: in its first heartbeat timeout a
// term recovers nothing. Terms end when the loop loses the database, and
// an outage that ended the last one (a Postgres restart or failover) kept
// every executor from heartbeating too — their handlers ran on, and
// recovering their attempts the moment the database came back would run
// them twice, past the pool's limit, and throw their results away.
func (it *iteration) recover(ctx context.Context) (int, error) {
	l := it.l
	due := it.now.Sub(l.lastRecovery) >= l.m.cfg.RecoveryPeriod
	hooksDue := !l.nextHookAt.IsZero() && !it.now.Before(l.nextHookAt)
	if !due && !hooksDue {
		return 0, nil
	}
	n := 0
	if due && it.now.Sub(l.termStart) < l.m.cfg.HeartbeatTimeout {
		due = false // (see above; the next period looks again)
		l.lastRecovery = it.now
	}
	if due {
		l.lastRecovery = it.now
		stale, err := it.stale(ctx)
		if err != nil {
			return 0, err
		}
		if len(stale) > 0 {
			it.needSync = true
			done, err := l.m.completeTxCallingHooksUntil(ctx, it.locking, stale, it.hookBudget())
			if err != nil {
				return 0, fmt.Errorf("recovering stale work: %w", err)
			}
			ids := make([]string, 0, min(len(stale), 20))
			for _, r := range stale[:cap(ids)] {
				ids = append(ids, r.id.String())
			}
			// (counted and told once the iteration commits: rolled back,
			// nothing was recovered)
			AfterCommit(ctx, func() {
				l.m.countRecorded(done)
				l.m.logger.Warn("recovered work whose executor went silent; its attempts count as failed and are retried per their policy",
					"pool", l.pool, "count", len(stale), "work_ids", ids, "heartbeat_timeout", l.m.cfg.HeartbeatTimeout.String())
			})
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
		return attemptResult{id: id, pool: it.l.pool, attempt: int(attempts) + 1, kind: kindFailed, err: msg, retryable: true}, nil
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
	// (reveille_workpool_hook_retries_total: runHooks counts the calls
	// made that failed before, not the first calls the loop deferred)
	n, err := it.l.m.runHooks(ctx, it.tx, calls, true, false, it.hookBudget())
	if err != nil {
		return 0, err
	}
	return n, nil
}

// start fills free slots with ready work: the plain pick when fair share
// has nothing to share, else the fair one; both start what they picked with
// the fast path's statement tail, claiming this replica's share. A paused
// pool has no free slots: the pause was read from the pool row this
// transaction holds locked, so no pause commits between that read and the
// start.
func (it *iteration) start(ctx context.Context) error {
	l := it.l
	if it.paused {
		return nil
	}
	startPlain, startFair := sqlStartPlain, sqlStartFair
	if it.besideCancels {
		startPlain, startFair = sqlStartPlainBesideCancels, sqlStartFairBesideCancels
	}
	if it.plain {
		var ok bool
		err := it.tx.QueryRow(ctx, startPlain, append(l.startArgs(it.now), int32(it.maxPar))...).Scan(append([]any{&ok}, it.started.dest()...)...)
		if err != nil {
			return fmt.Errorf("starting work: %w", err)
		}
		if ok {
			return nil
		}
		// Another org's work (or keyed work) committed after the census:
		// the plain start took nothing, and the fair one shares it.
		it.plain = false
	}
	args := append(append(l.startArgs(it.now), int32(it.maxPar), it.perOrg), l.turns.args()...)
	if err := it.tx.QueryRow(ctx, startFair, args...).Scan(append(it.charges.dest(), it.started.dest()...)...); err != nil {
		return fmt.Errorf("starting work: %w", err)
	}
	return nil
}

// outlook decides, when an iteration found nothing to do, what the loop
// publishes and when it must wake by itself: it stays "running" through
// the cooldown; goes "scheduled" while slots are in use or work waits for
// its run_at (waking for the earliest start, the next recovery, or a hook
// retry); and goes "idle" when nothing remains — only a kick wakes it then.
// A paused pool skips the cooldown (it starts nothing, so it is not
// "running") and is never saturated; it wakes only for what proceeds
// during a pause — recovery of running work and hook retries — and the
// resume's kick.
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
	wake := nextHook
	if !it.paused {
		wake = earliest(wake, nextRun)
	}
	if used > 0 {
		wake = earliest(wake, ptr(l.lastRecovery.Add(l.m.cfg.RecoveryPeriod)))
	}
	if ready && used == 0 && !it.paused {
		// Ready work that did not start although nothing runs: no cap or
		// key can hold it back, so its row was locked; look again shortly.
		// (Work held back by its org's cap or its key while slots are in
		// use starts when a completion kicks the loop.) Or no org queue
		// names it — work written by something that does not keep the
		// queues: a hand-made INSERT, a replica of a version before them —
		// and no start will see it until the queues are repaired: ask the
		// chores for that now, not at their next tick (up to a minute).
		wake = earliest(wake, ptr(it.now.Add(100*time.Millisecond)))
		select {
		case l.repairc <- struct{}{}:
		default:
		}
	}
	var st RunStatus
	switch {
	case !it.paused && it.now.Sub(l.lastActivity) < l.m.cfg.Cooldown:
		st = RunStatus{Kind: "running"}
		wake = earliest(wake, ptr(l.lastActivity.Add(l.m.cfg.Cooldown)))
	case used > 0 || nextRun != nil || ready || nextHook != nil:
		st = RunStatus{Kind: "scheduled", Saturated: !it.paused && used >= int64(it.maxPar)}
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

// startedWork is what sqlStartPicked returns: the start lag of every item
// started, whether other replicas' executors were notified, and the items
// this replica's executor was handed, column by column.
type startedWork struct {
	lags               []float64
	notified           int64
	ids                []uuid.UUID
	orgs, handlers     []string
	args               []string
	attempts, timeouts []int32
	hooks              []bool
}

func (s *startedWork) dest() []any {
	return []any{&s.lags, &s.notified, &s.ids, &s.orgs, &s.handlers, &s.args, &s.attempts, &s.timeouts, &s.hooks}
}

// startArgs are the parameters every start statement takes ($1–$7). The
// executor's free capacity they offer is reserved (executor.handoff) until
// the starts are launched or the iteration ends (releaseHandoff); a second
// start before then (the fair one, after a plain start that took nothing)
// is offered the same reservation.
func (l *loop) startArgs(now time.Time) []any {
	if l.handed == nil {
		names, free, share := l.m.exec.handoff()
		l.handed = &handoff{names: names, free: free, share: share}
	}
	h := l.handed
	return []any{l.pool, now, "s:" + l.pool + "@" + l.m.origin, h.names, int32(h.free), h.share, [16]byte(l.m.exec.id)}
}

// handoff is what a loop's start statements offer this replica's executor.
type handoff struct {
	names []string
	free  int
	share float64
}

// releaseHandoff gives the executor back the capacity reserved for the
// loop's starts (none held: a no-op).
func (l *loop) releaseHandoff() {
	if l.handed != nil {
		l.m.exec.unreserve(l.handed.free)
		l.handed = nil
	}
}

// launch counts committed starts and runs this replica's share of them.
func (l *loop) launch(s startedWork) {
	defer l.releaseHandoff() // (after adopt: the launched count as active)
	if len(s.lags) == 0 {
		return
	}
	met := l.m.metrics
	met.started.WithLabelValues(l.pool).Add(float64(len(s.lags)))
	lag := met.startLag.WithLabelValues(l.pool)
	for _, sec := range s.lags {
		lag.Observe(max(sec, 0))
	}
	if len(s.ids) > 0 {
		jobs := make([]claimedJob, len(s.ids))
		for i := range s.ids {
			jobs[i] = claimedJob{Job: Job{ID: s.ids[i], OrgID: s.orgs[i], Pool: l.pool, Handler: s.handlers[i],
				Args: json.RawMessage(s.args[i]), Attempt: int(s.attempts[i]) + 1},
				timeout: time.Duration(s.timeouts[i]) * time.Millisecond, hook: s.hooks[i]}
		}
		l.m.exec.adopt(jobs)
	}
	if len(s.lags) > len(s.ids) {
		l.m.exec.kick() // unclaimed work: for any executor, this one included
	}
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

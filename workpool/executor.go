package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/jsonb"
)

const (
	// claimBatch bounds one claim statement.
	claimBatch = 1000
	// reportBatch bounds one transaction of the completer.
	reportBatch = 1000
	// abandonGrace is how long past its timeout a handler that ignores its
	// context may run before the attempt is reported failed without it.
	abandonGrace = 2 * time.Second
	// recordAtStop bounds recording the last results (hand-backs included)
	// at shutdown, whatever remains of Stop's context.
	recordAtStop = 5 * time.Second
	// kickTimeout bounds a held kick sent after the drain's context ended
	// (its NOTIFY, for a loop led by another replica: one statement).
	kickTimeout = time.Second
)

var (
	errWorkCanceled = errors.New("work canceled")
	errStopping     = errors.New("executor stopping")
	errLost         = errors.New("attempt no longer held by this executor")
)

// executor is this replica's worker: it claims started work of the
// handlers registered here, runs each attempt in its own goroutine with its
// timeout and heartbeats what it runs; its completer (completer.go)
// records the results.
type executor struct {
	m  *Manager
	id uuid.UUID // claimed_by

	kickc chan struct{}

	// claiming is held (read) by every statement that claims work for this
	// executor — its own claims, the loops' starts that hand it its share —
	// from before the statement is sent until what it claimed is launched,
	// and (write) by releaseOrphans, which so never takes a claim whose
	// launch is on its way. orphans is set when such a statement failed
	// with its outcome unknown (a reply lost with its connection): it may
	// have committed claims this executor never launched.
	claiming sync.RWMutex
	orphans  atomic.Bool

	mu     sync.Mutex
	jobs   map[uuid.UUID]*runningJob // running, or returned and awaiting their record
	active int                       // handlers running
	// reserved: capacity promised to statements in flight that claim work
	// for this executor (a loop's start, its own claim) and not launched
	// yet. Counted against MaxWorkers with active: each pool's loop and the
	// claim loop read the free capacity concurrently, and without it each
	// could claim all of it (a replica leading three pools ran three times
	// MaxWorkers handlers).
	reserved int
	backlog  bool          // a claim was cut short by MaxWorkers
	idle     chan struct{} // closed when active drops to 0 during drain

	handlerCtx  context.Context // parent of every handler's context
	stopHandler context.CancelCauseFunc
	claimCtx    context.Context
	stopClaim   context.CancelFunc
	bgCtx       context.Context // heartbeats
	stopBg      context.CancelFunc
	claimDone   chan struct{}
	bgWG        sync.WaitGroup
	// finishing orders the finishes in flight before the drain's last
	// flush: a finish holds it shared from winning its job until its result
	// is queued. (A lock, not a WaitGroup: work adopted after the drain
	// would Add while it waits, which a WaitGroup forbids.)
	finishing sync.RWMutex

	completer *completer
	started   atomic.Bool
	crashed   atomic.Bool // tests: behave like a killed process
}

type runningJob struct {
	id       uuid.UUID
	pool     string
	attempt  int
	hook     bool
	cancel   context.CancelCauseFunc
	canceled atomic.Bool // the work was canceled
	finished atomic.Bool // a result was handed to the completer
	// lost: the attempt is no longer this executor's (errLost): whoever
	// holds the row now decides it, and this run's result is not recorded
	// — after a Postgres crash lost its start, the row may be running that
	// same attempt again, started anew, and the result of a run given up
	// would be taken as that attempt's. Set under e.mu (loseJob), and read
	// there by finish.
	lost atomic.Bool
	// restarts counts the starts of this attempt since it began here that
	// let it go on (launch): a heartbeat whose answer predates one does not
	// give the run up. Guarded by e.mu.
	restarts int
}

// loseJob gives up rj's attempt (errLost), unless its result is already
// handed over. The caller holds e.mu.
func loseJob(rj *runningJob) {
	if rj.finished.Load() {
		return
	}
	rj.lost.Store(true)
	rj.cancel(errLost)
}

func newExecutor(m *Manager) *executor {
	e := &executor{m: m, id: newID(), kickc: make(chan struct{}, 1), jobs: map[uuid.UUID]*runningJob{},
		claimDone: make(chan struct{})}
	e.handlerCtx, e.stopHandler = context.WithCancelCause(context.Background())
	e.claimCtx, e.stopClaim = context.WithCancel(context.Background())
	e.bgCtx, e.stopBg = context.WithCancel(context.Background())
	e.completer = newCompleter(m, e.reported, e.crashed.Load)
	return e
}

func (e *executor) start() {
	e.started.Store(true)
	go func() { defer close(e.claimDone); e.claimLoop() }()
	e.bgWG.Add(1)
	go func() { defer e.bgWG.Done(); e.heartbeatLoop() }()
	e.completer.Start()
	e.kick()
}

// kick asks the executor to claim.
func (e *executor) kick() {
	select {
	case e.kickc <- struct{}{}:
	default:
	}
}

func (e *executor) claimLoop() {
	backoff := newBackoff(50*time.Millisecond, 5*time.Second)
	// Claims follow kicks (a loop's NOTIFY, a registration, freed
	// capacity), and a poll every heartbeat interval besides: a
	// notification lost while this replica's LISTEN connection was not up
	// (starting, reconnecting) would otherwise leave work started for this
	// replica's handlers unclaimed until the heartbeat timeout recovered it
	// and counted an attempt it never ran.
	poll := time.NewTicker(e.m.cfg.HeartbeatInterval)
	defer poll.Stop()
	for {
		select {
		case <-e.claimCtx.Done():
			return
		case <-e.kickc:
		case <-poll.C:
		}
		for e.claimCtx.Err() == nil {
			if e.orphans.Load() {
				if err := e.releaseOrphans(); err != nil {
					if e.claimCtx.Err() != nil {
						return
					}
					e.m.logger.Warn("releasing work claimed for this replica that it never ran failed; retrying", "error", err.Error())
					e.m.metrics.failedAt(stageClaim)
					if !sleepCtx(e.claimCtx, backoff.next()) {
						return
					}
					continue
				}
			}
			n, limit, err := e.claimOnce()
			if err != nil {
				if e.claimCtx.Err() == nil {
					e.m.logger.Warn("claiming work failed", "error", err.Error())
					e.m.metrics.failedAt(stageClaim)
					if !sleepCtx(e.claimCtx, backoff.next()) {
						return
					}
					continue
				}
				return
			}
			backoff.reset()
			if n < limit || limit == 0 {
				break
			}
		}
	}
}

// claimOnce claims up to the free capacity and launches the attempts.
func (e *executor) claimOnce() (n, limit int, err error) {
	names := e.m.handlerNames()
	if len(names) == 0 {
		return 0, 0, nil
	}
	limit = e.reserve(claimBatch, true)
	defer e.unreserve(limit)
	if limit <= 0 {
		return 0, limit, nil
	}
	e.claiming.RLock()
	defer e.claiming.RUnlock()
	t0 := time.Now()
	jobs, err := e.claim(names, limit)
	if err != nil {
		e.claimLost()
		return 0, limit, err
	}
	e.m.metrics.claimSeconds.Observe(time.Since(t0).Seconds())
	e.m.metrics.claimBatch.Observe(float64(len(jobs)))
	for _, j := range jobs {
		e.launch(j)
	}
	return len(jobs), limit, nil
}

type claimedJob struct {
	Job
	timeout  time.Duration
	canceled bool
	hook     bool // the work has an onComplete hook
}

// claim takes started work with SKIP LOCKED. The claim commits without
// waiting for the WAL flush: if a crash loses it, the attempt is simply
// claimed and run again, as after any executor crash.
func (e *executor) claim(handlers []string, limit int) ([]claimedJob, error) {
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
	b.Queue(sqlClaim, [16]byte(e.id), e.m.now(), handlers, int32(limit))
	// Not canceled by Stop: a claim that committed must be read and run
	// (Stop then drains it), not left claimed and unrun until recovery.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.claimCtx), e.m.cfg.StatementTimeout)
	defer cancel()
	br := db.SendBatch(ctx, e.m.db, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("claiming work: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("claiming work: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimedJob, error) {
		var (
			j         claimedJob
			attempts  int32
			timeoutMS int32
		)
		err := r.Scan(&j.ID, &j.OrgID, &j.Pool, &j.Handler, &j.Args, &attempts, &timeoutMS, &j.canceled, &j.hook)
		j.Attempt = int(attempts) + 1
		j.timeout = time.Duration(timeoutMS) * time.Millisecond
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("claiming work: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("claiming work: %w", err)
	}
	return jobs, nil
}

// handoff says what the loop may claim for this executor while it starts
// work: the handlers registered here, the free capacity, and the share of
// each start (1/replicas with live executors, so that every replica's
// executor gets work). The free capacity is reserved for the loop until
// it gives it back (unreserve), once what it claimed is launched.
func (e *executor) handoff() (handlers []string, free int, share float64) {
	if e.claimCtx.Err() != nil || !e.started.Load() || e.crashed.Load() {
		return nil, 0, 0
	}
	return e.m.handlerNames(), e.reserve(e.m.cfg.MaxWorkers, false), 1 / float64(1+e.m.livePeers())
}

// reserve reserves the free capacity, at most limit, for a statement that
// claims work for this executor, and returns it; a claim found none
// (short) is a backlog, claimed again when capacity frees.
func (e *executor) reserve(limit int, short bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	free := min(max(e.m.cfg.MaxWorkers-e.active-e.reserved, 0), limit)
	if free == 0 && short {
		e.backlog = true
	}
	e.reserved += free
	return free
}

// unreserve gives back a reservation once what its statement claimed is
// launched (counted in active) or the statement failed: what it left
// unused is free again, for a claim cut short meanwhile.
func (e *executor) unreserve(n int) {
	if n <= 0 {
		return
	}
	e.mu.Lock()
	e.reserved -= n
	kick := e.backlog
	e.backlog = false
	e.mu.Unlock()
	if kick {
		e.kick()
	}
}

// claimLost notes that a statement claiming work for this executor failed
// and may have committed all the same: its claims are released by the
// claim loop, which it kicks.
func (e *executor) claimLost() {
	e.orphans.Store(true)
	e.kick()
}

// releaseOrphans hands back, to any executor, running work claimed for
// this one that it does not run: what a claim or start whose reply was lost
// committed for it. Left claimed, nothing would run it (executors claim
// unclaimed work only, and heartbeat only what they run), and after the
// heartbeat timeout recovery would count an attempt that never ran — work
// without retries failing for good while its replica was alive.
func (e *executor) releaseOrphans() error {
	e.claiming.Lock()
	defer e.claiming.Unlock()
	e.mu.Lock()
	held := make([]uuid.UUID, 0, len(e.jobs))
	for id := range e.jobs {
		held = append(held, id)
	}
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.claimCtx, e.m.cfg.StatementTimeout)
	defer cancel()
	var freed, found int64
	if err := e.m.db.QueryRow(ctx, sqlReleaseOrphans, [16]byte(e.id), pgUUIDs(held)).Scan(&freed, &found); err != nil {
		return fmt.Errorf("releasing work claimed for this executor that it does not run: %w", err)
	}
	// (rows another transaction held are left for the claim loop's next
	// pass: it polls every heartbeat interval)
	e.orphans.Store(freed < found)
	if freed > 0 {
		e.m.logger.Warn("released work claimed for this replica by a statement whose answer was lost; it runs now", "count", freed)
	}
	return nil
}

// adopt runs attempts the loop claimed for this executor.
func (e *executor) adopt(jobs []claimedJob) {
	e.m.metrics.claimBatch.Observe(float64(len(jobs)))
	for _, j := range jobs {
		e.launch(j)
	}
}

// launch runs one attempt in its own goroutine.
func (e *executor) launch(j claimedJob) {
	ctx, cancel := context.WithCancelCause(e.handlerCtx)
	rj := &runningJob{id: j.ID, pool: j.Pool, attempt: j.Attempt, hook: j.hook, cancel: cancel}
	e.mu.Lock()
	if prev, ok := e.jobs[j.ID]; ok && prev.attempt == j.Attempt && !prev.lost.Load() {
		// The attempt this executor already runs, started again: its start
		// was lost (a Postgres crash took the commit, which does not wait
		// for the disk) and the work, pending again with the same attempt
		// count, was started anew. It runs once: the run under way reports
		// for this attempt, as the row now expects.
		prev.restarts++ // (a heartbeat's answer from before this start is stale)
		if j.canceled { // (canceled since: it stops now, as a launch would)
			prev.canceled.Store(true)
			prev.cancel(errWorkCanceled)
		}
		e.mu.Unlock()
		cancel(nil)
		e.m.logger.Warn("work started again while this replica runs that attempt (its start was lost); the run under way goes on",
			"work_id", j.ID, "attempt", j.Attempt)
		return
	} else if ok {
		// A later attempt of work this executor still runs (recovery took
		// the earlier one while its heartbeats failed, and the heartbeat,
		// which asks only of the attempt held here, would never say so),
		// or this attempt started again after the run under way was given
		// up: that run's result is not recorded.
		loseJob(prev)
	}
	e.jobs[j.ID] = rj
	e.active++
	e.mu.Unlock()
	if j.canceled {
		// Canceled between start and claim: it must not run at all.
		rj.canceled.Store(true)
		cancel(errWorkCanceled)
		go e.finish(rj, attemptResult{kind: kindFailed, err: "canceled before it ran"})
		return
	}
	go e.run(ctx, rj, j)
}

// run executes the handler under the attempt's timeout; a handler that
// ignores its context past the timeout is abandoned and reported failed.
func (e *executor) run(ctx context.Context, rj *runningJob, j claimedJob) {
	h, ok := e.m.handler(j.Handler)
	if !ok {
		e.finish(rj, attemptResult{kind: kindFailed, err: fmt.Sprintf("handler %q is not registered on this replica", j.Handler), retryable: true})
		return
	}
	tctx, cancelT := context.WithTimeoutCause(ctx, j.timeout, context.DeadlineExceeded)
	defer cancelT()
	watchdog := time.AfterFunc(j.timeout+abandonGrace, func() {
		e.finish(rj, attemptResult{kind: kindFailed, err: fmt.Sprintf("attempt timed out after %s (handler did not return)", j.timeout), retryable: true})
	})
	res, err := callHandler(tctx, h, j.Job)
	watchdog.Stop()
	e.finish(rj, e.classify(tctx, rj, j, res, err))
}

// callHandler runs h, turning a panic into an error.
func callHandler(ctx context.Context, h Handler, j Job) (res json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler %q panicked: %v", j.Handler, r)
		}
	}()
	return h(ctx, j)
}

// classify turns a handler's return into an attempt result.
func (e *executor) classify(ctx context.Context, rj *runningJob, j claimedJob, res json.RawMessage, err error) attemptResult {
	cause := context.Cause(ctx)
	failed := func(msg string, retryable bool) attemptResult {
		return attemptResult{kind: kindFailed, err: msg, retryable: retryable}
	}
	switch {
	case rj.canceled.Load():
		return failed("canceled", false)
	case err == nil && len(res) > 0 && !json.Valid(res):
		return failed("handler returned invalid JSON", false)
	case err == nil && len(res) > MaxResultBytes:
		return failed(fmt.Sprintf("handler result exceeds %d bytes", MaxResultBytes), false)
	case err == nil && !jsonb.Storable(res):
		// Postgres would refuse it; recording would find it out, at the
		// cost of splitting the batch (completeApart).
		return failed(`handler returned JSON that Postgres cannot store (\u0000, an unpaired surrogate escape, bytes that are not UTF-8 or a number out of range)`, false)
	case err == nil && jsonb.NumberGrowth(res) > jsonb.MaxNumberGrowth:
		// (jsonb prints numbers in plain notation, and every read of the
		// result — its hook, the wake signal, GET — would carry the digits)
		return failed(fmt.Sprintf("handler result's numbers are more than %d bytes longer as stored (in plain notation: 1e5000 is 5001 digits)", jsonb.MaxNumberGrowth), false)
	case err == nil:
		return attemptResult{kind: kindSucceeded, result: res}
	case errors.Is(cause, errStopping):
		// This replica is shutting down and interrupted the handler: the
		// work goes back to the pool at once, the attempt uncounted.
		return attemptResult{kind: kindHandBack, err: "interrupted: the executor stopped: " + errorText(err)}
	case IsNonRetryable(err):
		// The handler's own verdict wins over a timeout that passed while it
		// worked: it knows a retry would fail the same way.
		return failed(errorText(err), false)
	case errors.Is(cause, context.DeadlineExceeded) && ctx.Err() != nil:
		return failed(fmt.Sprintf("attempt timed out after %s: %s", j.timeout, errorText(err)), true)
	}
	return failed(errorText(err), true)
}

// errorText is err's message as Postgres text can hold it: a handler's
// error may quote what a work target sent (NUL, bytes that are not UTF-8,
// a rune cut in half), and one such message would fail the statement that
// records the whole batch, again at every retry.
func errorText(err error) string {
	return jsonb.Text(err.Error())
}

// finish hands an attempt's result to the completer, once.
func (e *executor) finish(rj *runningJob, r attemptResult) {
	e.finishing.RLock()
	if !rj.finished.CompareAndSwap(false, true) {
		e.finishing.RUnlock()
		return
	}
	r.id, r.pool, r.attempt, r.hook = rj.id, rj.pool, rj.attempt, rj.hook
	// (read under e.mu, where loseJob decides: a run it gives up from now
	// on is finished, and it leaves it be)
	e.mu.Lock()
	lost := rj.lost.Load()
	e.mu.Unlock()
	if !lost {
		// The result is queued before the handler counts as returned: a
		// drain that sees the executor idle stops the completer next, and
		// its last flush must find this result (queued after it, a
		// hand-back was lost and the work left running until the
		// heartbeat timeout recovered it).
		e.completer.add(r)
	}
	e.finishing.RUnlock()
	e.mu.Lock()
	if lost && e.jobs[rj.id] == rj {
		delete(e.jobs, rj.id) // (no report will forget it)
	}
	e.active--
	kick := e.backlog
	e.backlog = false
	if e.active == 0 && e.idle != nil {
		close(e.idle)
		e.idle = nil
	}
	e.mu.Unlock()
	if kick {
		e.kick()
	}
}

// reported forgets attempts whose results are committed.
func (e *executor) reported(rs []attemptResult) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range rs {
		if rj, ok := e.jobs[r.id]; ok && rj.attempt == r.attempt {
			delete(e.jobs, r.id)
			rj.cancel(nil)
		}
	}
}

// cancelJobs cancels the handlers of canceled work running here.
func (e *executor) cancelJobs(ids []uuid.UUID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range ids {
		if rj, ok := e.jobs[id]; ok {
			rj.canceled.Store(true)
			rj.cancel(errWorkCanceled)
		}
	}
}

func (e *executor) heartbeatLoop() {
	t := time.NewTicker(e.m.cfg.HeartbeatInterval)
	defer t.Stop()
	e.announce()
	for {
		select {
		case <-e.bgCtx.Done():
			return
		case <-t.C:
		}
		if e.crashed.Load() {
			continue
		}
		e.announce()
		if err := e.heartbeat(); err != nil && e.bgCtx.Err() == nil {
			e.m.logger.Warn("heartbeat failed", "error", err.Error())
			e.m.metrics.failedAt(stageHeartbeat)
		}
	}
}

// announce tells the other replicas' loops that this executor is alive, so
// that they share the work they start with it.
func (e *executor) announce() {
	if _, err := e.m.db.Exec(e.bgCtx, sqlNotify, "h:@"+e.m.origin); err != nil && e.bgCtx.Err() == nil {
		e.m.logger.Warn("announcing the executor failed", "error", err.Error())
		e.m.metrics.failedAt(stageHeartbeat) // the announcement is a heartbeat's, to the other replicas
	}
}

// heartbeat keeps this executor's attempts alive; it learns which were
// canceled (their handlers are canceled) and which were taken from it by
// recovery (their handlers are canceled too; their results will not count).
func (e *executor) heartbeat() error {
	e.mu.Lock()
	// The runs asked about: a run of the same work started here after the
	// query (a retry due at once) is not the one the answer is about.
	asked := make(map[uuid.UUID]*runningJob, len(e.jobs))
	restarts := make(map[uuid.UUID]int, len(e.jobs)) // (as they stood when asked)
	ids := make([]uuid.UUID, 0, len(e.jobs))
	for id, rj := range e.jobs {
		ids = append(ids, id)
		asked[id] = rj
		restarts[id] = rj.restarts
	}
	// (running handlers only: a loop's start reserves every free worker
	// for a moment, and claims what it reserved)
	full := e.active >= e.m.cfg.MaxWorkers
	e.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	// (bounded: a heartbeat stuck on a dead connection after a failover
	// would hold up every later one until recovery took the attempts)
	ctx, cancel := context.WithTimeout(e.bgCtx, e.m.cfg.HeartbeatTimeout/2)
	defer cancel()
	rows, err := e.m.db.Query(ctx, sqlHeartbeat, pgUUIDs(ids), [16]byte(e.id), e.m.now())
	if err != nil {
		return fmt.Errorf("heartbeating %d attempts: %w", len(ids), err)
	}
	alive := map[uuid.UUID]bool{}
	var canceled []uuid.UUID
	for rows.Next() {
		var (
			id      uuid.UUID
			c, mine bool
			n       int64
		)
		if err := rows.Scan(&id, &c, &mine, &n); err != nil {
			rows.Close()
			return fmt.Errorf("heartbeating: %w", err)
		}
		alive[id] = mine
		if c && mine {
			canceled = append(canceled, id)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("heartbeating: %w", err)
	}
	e.cancelJobs(canceled)
	e.mu.Lock()
	for _, id := range ids {
		// (not a run this attempt was started again for since the
		// answer was read: the answer is about the row before that start)
		if rj := asked[id]; !alive[id] && rj.restarts == restarts[id] {
			loseJob(rj)
		}
	}
	e.mu.Unlock()
	if full {
		// Started work of the handlers run here that no executor has
		// claimed waits for a free worker — this one's, among others —
		// not for a silent one: counted from its start, recovery failed
		// it with an attempt never made once the heartbeat timeout
		// passed, on healthy replicas (work without retries failed for
		// good). Should every executor that runs its handler die, its
		// heartbeat stops and recovery takes it as before.
		if _, err := e.m.db.Exec(ctx, sqlKeepWaiting, e.m.handlerNames(), e.m.now()); err != nil {
			return fmt.Errorf("heartbeating work waiting for a worker: %w", err)
		}
	}
	return nil
}

// stopClaiming is the first stage of shutdown.
func (e *executor) stopClaiming() {
	e.stopClaim()
	if e.started.Load() {
		<-e.claimDone
	}
}

// drain lets running handlers finish within StopGrace (and ctx), then
// cancels them and hands their work back, records every result and stops
// heartbeating.
func (e *executor) drain(ctx context.Context) error {
	defer e.stopBg()
	wait := e.m.cfg.StopGrace
	if deadline, ok := ctx.Deadline(); ok {
		// Leave a quarter of what ctx allows for canceling and handing back.
		wait = max(min(wait, time.Until(deadline)*3/4), 0)
	}
	grace := time.NewTimer(wait)
	defer grace.Stop()
	if idle := e.idleChan(); idle != nil {
		select {
		case <-idle:
		case <-grace.C:
		case <-ctx.Done():
		}
	}
	e.stopHandler(errStopping)
	if idle := e.idleChan(); idle != nil {
		abandon := time.NewTimer(abandonGrace)
		defer abandon.Stop()
		select {
		case <-idle:
		case <-abandon.C:
		case <-ctx.Done():
		}
	}
	e.abandonRunning()
	// Recorded under a bound of its own: the hand-backs must reach the
	// database even when the caller's deadline went on the grace, or the
	// work would wait for the heartbeat timeout and lose an attempt.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordAtStop)
	defer cancel()
	// A handler that returned as the wait above ended may have won its
	// finish before abandonRunning and still be on its way to queuing the
	// result: the completer's last flush must come after it.
	e.finishing.Lock()
	//lint:ignore SA2001 the wait for the finishes in flight is the point
	e.finishing.Unlock()
	err := e.completer.Stop(rctx)
	e.stopBg()
	e.bgWG.Wait()
	return err
}

// abandonRunning hands back the work of handlers that ignored their
// canceled context, so that it runs again elsewhere at once.
func (e *executor) abandonRunning() {
	e.mu.Lock()
	var left []*runningJob
	for _, rj := range e.jobs {
		if !rj.finished.Load() {
			left = append(left, rj)
		}
	}
	e.mu.Unlock()
	for _, rj := range left {
		e.finish(rj, attemptResult{kind: kindHandBack, err: "interrupted: the executor stopped and the handler did not return"})
	}
}

// idleChan returns a channel closed when no handler runs, or nil if none
// runs now.
func (e *executor) idleChan() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.active == 0 {
		return nil
	}
	if e.idle == nil {
		e.idle = make(chan struct{})
	}
	return e.idle
}

// backoff doubles a wait up to a cap.
type backoff struct{ cur, min, max time.Duration }

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

// sleepCtx waits d unless ctx ends first (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

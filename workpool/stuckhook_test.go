package workpool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lockWaitHook is a stuck hook that honours its context: while its call's
// context lasts it tries again a statement that waits on a row lock the
// test holds (each try ended by the server at the hook statement timeout,
// HookTimeout, in a nested transaction it rolls back). Its last try, begun
// before the call's context ended, runs to its statement timeout (hookTx:
// "one begun in time runs to its end"), so the call lasts about
// 2 × HookTimeout, and fails with errHookTimeout — which docs/workpool.md
// promises fails the call alone: "rolled back to the savepoint, retried with
// the hook backoff — and the completion commits".
func lockWaitHook(calls *atomic.Int64) Hook {
	return func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		var err error
		for ctx.Err() == nil {
			err = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT 1 FROM stuck_hook_lock WHERE id = 1 FOR UPDATE`)
				return err
			})
		}
		return err
	}
}

func (h *harness) holdStuckHookLock() {
	h.t.Helper()
	h.exec(`CREATE TABLE stuck_hook_lock (id int PRIMARY KEY)`)
	h.exec(`INSERT INTO stuck_hook_lock VALUES (1)`)
	lock, err := h.db.Begin(h.ctx)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM stuck_hook_lock WHERE id = 1 FOR UPDATE`)
	require.NoError(h.t, err)
}

// A record of results whose hooks are stuck takes as long as their calls
// do (each up to 2 × HookTimeout + 1 s), far past StatementTimeout: each
// call fails alone and the batch commits. A deadline on the record as a
// whole cut it mid-statement, and the retry was cut at the same place, the
// same hooks called again, for good.
func TestARecordWhoseStuckHooksFailAloneCommitsPastTheStatementTimeout(t *testing.T) {
	const hookTimeout = 3 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	var calls atomic.Int64
	h.m.RegisterHook("stuck", lockWaitHook(&calls))
	var batch []attemptResult
	for range 2 {
		id := h.enqueue(withHook("stuck", `{}`))
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
	}
	h.runMain()
	h.holdStuckHookLock()

	ctx, cancel := context.WithTimeout(h.ctx, 40*time.Second)
	defer cancel()
	err := h.m.exec.completer.record(ctx, batch, nil)

	require.NoError(t, err, "the stuck hooks fail alone and the batch commits")
	for _, r := range batch {
		w := h.work(r.id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "retry", *w.hook)
	}
}

// The hooks of canceled pending work run in the loop's iteration. The
// first call takes 0.9 × HookTimeout; the second begins within the hook
// budget and is stuck (it fails after about 2 × HookTimeout): the
// iteration commits. A deadline on the iteration as a whole cut it there,
// and every next iteration the same way — nothing of the pool started.
func TestAnIterationWhoseLastHookCallIsStuckCommitsPastTheStatementTimeout(t *testing.T) {
	const hookTimeout = 5 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	var calls, stuckCalls atomic.Int64
	stuck := lockWaitHook(&stuckCalls)
	h.m.RegisterHook("h", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(hookTimeout * 9 / 10):
				return nil
			}
		}
		return stuck(ctx, tx, c)
	})
	ids := h.canceledWithHook("h", 2)
	h.holdStuckHookLock()

	_, err := h.l.iterateFull(h.ctx)

	require.NoError(t, err, "the stuck call fails alone; the iteration commits")
	for _, id := range ids {
		require.Equal(t, "finished", h.work(id).state)
	}
}

// A record with hooks of running work that a loop's iteration cancels
// waits on the work's row while the iteration makes its hook calls (the
// scenario of TestAnIterationWhoseLastHookCallIsStuckCommitsPastTheStatementTimeout:
// a first call of 0.9 × HookTimeout, then a stuck one, about 2 ×
// HookTimeout): its recording, which may wait on a lock, is not bounded
// per round trip, and commits. (A bound of StatementTimeout + 2 ×
// HookTimeout + 1 s cut it once HookTimeout passed StatementTimeout.)
func TestARecordWaitingOnTheRowsAnIterationHoldsThroughItsHookCallsIsNotCut(t *testing.T) {
	const hookTimeout = 5 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	var calls, stuckCalls atomic.Int64
	stuck := lockWaitHook(&stuckCalls)
	firstCall := make(chan struct{})
	h.m.RegisterHook("h", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			close(firstCall)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(hookTimeout * 9 / 10):
				return nil
			}
		}
		return stuck(ctx, tx, c)
	})
	h.m.RegisterHook("quick", func(context.Context, pgx.Tx, Completion) error { return nil })
	running := h.s2Running(withHook("quick", `{}`))
	h.cancel(running)
	h.canceledWithHook("h", 2)
	h.holdStuckHookLock()

	iterDone := make(chan error, 1)
	go func() {
		_, err := h.l.iterateFull(h.ctx)
		iterDone <- err
	}()
	<-firstCall // the iteration holds the running work's row (sqlMarkCanceled)
	t0 := time.Now()
	_, err := h.m.recordResults(h.ctx, []attemptResult{{id: running, pool: "default", attempt: 1, kind: kindSucceeded, hook: true}})
	took := time.Since(t0)
	require.NoError(t, <-iterDone)
	require.NoError(t, err, "a legitimate record was cut after %s (roundTripBound %s)", took, h.m.roundTripBound())
}

// A loop iteration that cancels running work whose result a record with
// hooks is recording waits on the work's row for as long as the record's
// hook calls take — each well within HookTimeout, a batch of them past any
// bound on one round trip: the iteration's cancelation is not bounded, and
// commits (cut, the loop stood down, and the next term's iteration waited
// on the same row again).
func TestAnIterationWaitingOnTheRowsARecordHoldsThroughItsHookCallsIsNotCut(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HookTimeout = time.Second; c.StatementTimeout = time.Second })
	firstCall := registerSleepingHook(h, "slow", "0.7")
	var ids []uuid.UUID
	for range 8 {
		ids = append(ids, h.enqueue(withHook("slow", `{}`)))
	}
	h.runMain()
	var batch []attemptResult
	for _, id := range ids {
		require.Equal(t, "running", h.work(id).state)
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
	}
	h.cancel(ids[0])
	recDone := make(chan error, 1)
	go func() {
		_, err := h.m.recordResults(h.ctx, batch)
		recDone <- err
	}()
	<-firstCall // the record holds the work's rows while it calls 8 hooks of 0.7 s
	t0 := time.Now()
	_, err := h.l.iterateFull(h.ctx)
	took := time.Since(t0)
	require.NoError(t, <-recDone)
	require.NoError(t, err, "a legitimate iteration was cut after %s (roundTripBound %s)", took, h.m.roundTripBound())
}

// Two records (two replicas' completers), each with a retried attempt of
// the same org: the first, with hooks, writes the org's queue row (the
// requeue) and keeps it locked while its hook calls run, a batch of them
// past any bound on one round trip; the second's recording — with hooks
// or without — waits on that row and commits (bounded, it was cut and
// tried again for as long as the first record lasted, every later result
// of its replica behind it).
func TestARecordWaitingOnTheOrgQueueARecordWithHooksHoldsIsNotCut(t *testing.T) {
	for _, withHooks := range []bool{true, false} {
		t.Run(map[bool]string{true: "with hooks", false: "without hooks"}[withHooks], func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.HookTimeout = time.Second; c.StatementTimeout = time.Second })
			firstCall := registerSleepingHook(h, "slow", "0.7")
			retryA := h.enqueue(withRetry(5, 60_000, 2))
			retryB := h.enqueue(withRetry(5, 60_000, 2))
			var slow []uuid.UUID
			for range 8 {
				slow = append(slow, h.enqueue(withHook("slow", `{}`)))
			}
			h.runMain()
			failed := func(id uuid.UUID) attemptResult {
				require.Equal(t, "running", h.work(id).state)
				return attemptResult{id: id, pool: "default", attempt: 1, kind: kindFailed, err: "boom", retryable: true}
			}
			batchA := []attemptResult{failed(retryA)}
			for _, id := range slow {
				require.Equal(t, "running", h.work(id).state)
				batchA = append(batchA, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
			}
			batchB := []attemptResult{failed(retryB)}
			batchB[0].hook = withHooks // (with: another item of its batch has one)

			recA := make(chan error, 1)
			go func() {
				_, err := h.m.recordResults(h.ctx, batchA)
				recA <- err
			}()
			<-firstCall // record A holds org-1's queue row while it calls 8 hooks of 0.7 s
			stop := make(chan struct{})
			seen := lockWaitSeen(h, sqlCompleteStart, stop)
			t0 := time.Now()
			_, err := h.m.recordResults(h.ctx, batchB)
			took := time.Since(t0)
			close(stop)
			require.True(t, <-seen, "the record waited on a lock")
			require.NoError(t, <-recA)
			require.NoError(t, err, "a legitimate record was cut after %s", took)
		})
	}
}

// A record with hooks that requeues a retried attempt holds its org's
// queue row for as long as its hook calls take. The leader's repair of the
// org queues (the first thing a new term does, and a chore) writes that
// row with INSERT ... ON CONFLICT DO UPDATE, which locks the row before
// testing its WHERE: it waits on the record, and is not cut (bounded by
// StatementTimeout, a term's start stood down and took over again for as
// long as the record lasted).
func TestARepairWaitingOnTheOrgQueueARecordHoldsIsNotCut(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HookTimeout = time.Second; c.StatementTimeout = time.Second })
	firstCall := registerSleepingHook(h, "slow", "0.7")
	retryA := h.enqueue(withRetry(5, 60_000, 2))
	var slow []uuid.UUID
	for range 8 {
		slow = append(slow, h.enqueue(withHook("slow", `{}`)))
	}
	h.runMain()
	// org-1 has pending plain work (the repair's walk finds the org)
	h.enqueue(withRunAt(h.clock.Now().Add(time.Hour)))
	batch := []attemptResult{{id: retryA, pool: "default", attempt: 1, kind: kindFailed, err: "boom", retryable: true}}
	for _, id := range slow {
		require.Equal(t, "running", h.work(id).state)
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
	}
	rec := make(chan error, 1)
	go func() {
		_, err := h.m.recordResults(h.ctx, batch)
		rec <- err
	}()
	<-firstCall // the record holds org-1's queue row while it calls 8 hooks of 0.7 s
	t0 := time.Now()
	_, err := h.l.repairQueues(h.ctx)
	took := time.Since(t0)
	require.NoError(t, <-rec)
	require.NoError(t, err, "a legitimate repair was cut after %s (StatementTimeout %s)", took, h.m.cfg.StatementTimeout)
}

// A hook that enqueues follow-up work (EnqueueTx on the hook's tx) locks
// its org's pending count row until the record commits, through the
// record's later hook calls. The leader's refresh of the pending counts
// locks that row in a fenced transaction, whose statements other than its
// own are not bounded: it waits, past leader.StatementTimeout, and is not
// cut (cut, the stalest org first every round, no org's count was
// refreshed while the row was held).
func TestARefreshOfPendingCountsWaitingOnARecordThatEnqueuedIsNotCut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxPending(1000), func(c *Config) { c.HookTimeout = 5 * time.Second; c.StatementTimeout = time.Second })
	firstCall := make(chan struct{})
	var calls atomic.Int64
	h.m.RegisterHook("chain", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			if _, err := h.m.EnqueueTx(ctx, tx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"}); err != nil {
				return err
			}
			close(firstCall)
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep(4.2)") // (within HookTimeout; 8 of them past leader.StatementTimeout)
		return err
	})
	var ids []uuid.UUID
	for range 8 {
		ids = append(ids, h.enqueue(withHook("chain", `{}`)))
	}
	h.runMain()
	var batch []attemptResult
	for _, id := range ids {
		require.Equal(t, "running", h.work(id).state)
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded, hook: true})
	}
	h.clock.Advance(pendingRefreshAfter + time.Second) // org-1's count is stale
	rec := make(chan error, 1)
	go func() {
		_, err := h.m.recordResults(h.ctx, batch)
		rec <- err
	}()
	<-firstCall
	time.Sleep(100 * time.Millisecond) // (the hook's enqueue done: org-1's pending row locked)
	t0 := time.Now()
	err := h.l.refreshPending(h.ctx)
	took := time.Since(t0)
	require.NoError(t, <-rec)
	require.NoError(t, err, "a legitimate refresh was cut after %s (leader.StatementTimeout 30 s)", took)
}

// A hook whose one round trip is a batch of statements (tx.SendBatch),
// each ended by the server at HookTimeout, may take several HookTimeouts:
// begun in time, it runs to its end (the call then fails alone, past its
// time). The bound on a batch's round trip is per statement, so the record
// commits (bounded as one statement, the batch was cut on the client, the
// connection closed and the whole record lost, every hook called again).
func TestAHooksBatchOfStatementsIsBoundedPerStatement(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HookTimeout = time.Second; c.StatementTimeout = time.Second })
	h.m.RegisterHook("batch", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		b := &pgx.Batch{}
		for range 3 {
			b.Queue("SELECT pg_sleep(0.9)") // each within HookTimeout on the server
		}
		return tx.SendBatch(ctx, b).Close()
	})
	h.m.RegisterHook("quick", func(context.Context, pgx.Tx, Completion) error { return nil })
	quick := h.enqueue(withHook("quick", `{}`))
	slow := h.enqueue(withHook("batch", `{}`))
	h.runMain()
	batch := []attemptResult{
		{id: quick, pool: "default", attempt: 1, kind: kindSucceeded, hook: true},
		{id: slow, pool: "default", attempt: 1, kind: kindSucceeded, hook: true},
	}
	t0 := time.Now()
	_, err := h.m.recordResults(h.ctx, batch)
	took := time.Since(t0)
	require.NoError(t, err, "the record was cut after %s (roundTripBound %s)", took, h.m.roundTripBound())
	require.Equal(t, "finished", h.work(quick).state)
}

// The loop's iteration marks running work canceled (its row locked) and
// then calls the hooks of canceled pending work, holding that row through
// its hook calls (up to about two HookTimeouts). The running work's result
// arrives meanwhile, in a record without hooks: it waits on the row and is
// not cut.
func TestARecordWithoutHooksWaitingOnARowTheIterationHoldsThroughItsHookCallsIsNotCut(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HookTimeout = 2 * time.Second; c.StatementTimeout = time.Second })
	firstCall := registerSleepingHook(h, "slow", "1.5")
	running := h.enqueue()
	h.runMain()
	require.Equal(t, "running", h.work(running).state)
	var later []uuid.UUID
	for range 3 {
		later = append(later, h.enqueue(withHook("slow", `{}`), withRunAt(h.clock.Now().Add(time.Hour))))
	}
	h.cancel(running)
	for _, id := range later {
		h.cancel(id)
	}
	iter := make(chan error, 1)
	go func() {
		_, err := h.l.iterateFull(h.ctx)
		iter <- err
	}()
	<-firstCall // the iteration holds the running work's row while it calls the canceled work's hooks
	stop := make(chan struct{})
	seen := lockWaitSeen(h, sqlCompleteStart, stop)
	t0 := time.Now()
	_, err := h.m.recordResults(h.ctx, []attemptResult{{id: running, pool: "default", attempt: 1, kind: kindSucceeded}})
	took := time.Since(t0)
	close(stop)
	require.True(t, <-seen, "the record waited on a lock")
	require.NoError(t, <-iter)
	require.NoError(t, err, "a legitimate plain record was cut after %s (StatementTimeout %s)", took, h.m.cfg.StatementTimeout)
}

// lockWaitSeen watches, until stop is closed, for a backend waiting on a
// lock while running a statement that contains like (pg_stat_activity's
// query is cut at track_activity_query_size: give its beginning); it
// reports whether one was seen.
func lockWaitSeen(h *harness, like string, stop <-chan struct{}) <-chan bool {
	seen := make(chan bool, 1)
	go func() {
		found := false
		for {
			select {
			case <-stop:
				seen <- found
				return
			case <-time.After(50 * time.Millisecond):
			}
			var w bool
			err := h.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1)`, "%"+like+"%").Scan(&w)
			if err != nil {
				h.t.Logf("watching lock waits: %v", err)
			}
			if w {
				found = true
			}
		}
	}()
	return seen
}

// sqlCompleteStart is the beginning of sqlComplete, as pg_stat_activity
// shows it.
const sqlCompleteStart = "SELECT * FROM unnest($1::uuid[], $2::int[], $3::text["

// registerSleepingHook registers a hook that sleeps for seconds on the
// server (within HookTimeout), and returns a channel closed at its first
// call.
func registerSleepingHook(h *harness, name, seconds string) <-chan struct{} {
	firstCall := make(chan struct{})
	var calls atomic.Int64
	h.m.RegisterHook(name, func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			close(firstCall)
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep("+seconds+")")
		return err
	})
	return firstCall
}

// A loop's iteration holds the pool row until it commits, through the hook
// calls it makes (canceled work's hooks, each within HookTimeout). Another
// replica's loop taking over the pool meanwhile (its term begun, the
// former leader's iteration still in flight) waits on that row, and is not
// cut (bounded, the new term stood down and took over again until the old
// iteration ended).
func TestATakeoverWaitingOnThePoolRowAnIterationHoldsThroughItsHookCallsIsNotCut(t *testing.T) {
	const hookTimeout = 3 * time.Second
	h := newHarness(t, func(c *Config) { c.HookTimeout = hookTimeout; c.StatementTimeout = time.Second })
	firstCall := make(chan struct{})
	var calls atomic.Int64
	h.m.RegisterHook("h", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			close(firstCall)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(hookTimeout * 8 / 10):
			return nil
		}
	})
	h.canceledWithHook("h", 2)
	iterDone := make(chan error, 1)
	go func() {
		_, err := h.l.iterateFull(h.ctx)
		iterDone <- err
	}()
	<-firstCall // the iteration holds the pool row (sqlBump) through its hook calls
	other := newLoop(h.m, "default")
	t0 := time.Now()
	err := other.takeover(h.ctx)
	took := time.Since(t0)
	require.NoError(t, <-iterDone)
	require.NoError(t, err, "a takeover waiting on the pool row an iteration holds was cut after %s (StatementTimeout %s)", took, h.m.cfg.StatementTimeout)
}

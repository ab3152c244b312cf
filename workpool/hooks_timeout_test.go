package workpool

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A hook allowed by Config (HookTimeout may be up to an hour) that spends
// 31 s in Go — well within its HookTimeout of 45 s — must not lose the
// completion it belongs to. The loop runs the hooks of canceled pending
// work (and hook retries) in its iteration's transaction, which open()
// bounded by idle_in_transaction_session_timeout = 30s: the server killed
// the connection, the iteration failed, and the cancelation was rolled
// back with it — at every iteration, for good. Found by review.
func TestALoopRunHookWithinItsHookTimeoutDoesNotEndTheIteration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 45 * time.Second })
	var calls atomic.Int64
	h.m.RegisterHook("slow", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		select { // e.g. an outbound call that takes 31 s, honouring its context
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(31 * time.Second):
		}
		return nil
	})
	id := h.canceledWithHook("slow", 1)[0]

	_, err := h.l.iterateFull(h.ctx)

	require.NoError(t, err, "a hook call within HookTimeout must not fail the loop's iteration")
	w := h.work(id)
	require.Equal(t, "finished", w.state, "the canceled work finished")
	require.Equal(t, "canceled", *w.outcome)
}

// A hook call stuck past HookTimeout "fails like any failed call — rolled
// back to the savepoint, retried with the hook backoff — and the completion
// commits" (docs/workpool.md). In a batch, the bisection called the stuck
// hook a second time at once in the same transaction, so one stuck call
// held every completion of its batch (other orgs' included) for twice
// HookTimeout, and counted as one failed attempt. Found by review.
func TestAStuckHookInABatchIsCalledOnceBeforeItsBackoff(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.HookTimeout = timeout })
	h.exec(`CREATE TABLE test_hook_lock (id int PRIMARY KEY)`)
	h.exec(`INSERT INTO test_hook_lock VALUES (1)`)
	var stuckCalls atomic.Int64
	var stuckID uuid.UUID
	h.m.RegisterHook("maybe-stuck", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if c.WorkID != stuckID {
			return nil
		}
		stuckCalls.Add(1)
		_, err := tx.Exec(ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
		return err
	})
	stuckID = h.enqueue(withHook("maybe-stuck", `{}`), withOrg("org-a"))
	other := h.enqueue(withHook("maybe-stuck", `{}`), withOrg("org-b"))
	h.runMain()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(h.ctx) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)

	t0 := time.Now()
	require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		_, err := h.m.completeTx(h.ctx, tx, []attemptResult{
			{id: stuckID, pool: "default", attempt: 1, kind: kindSucceeded},
			{id: other, pool: "default", attempt: 1, kind: kindSucceeded},
		})
		return err
	}))
	elapsed := time.Since(t0)

	var hookAttempts int
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT hook_attempts FROM workpool_work WHERE id = $1`, stuckID).Scan(&hookAttempts))
	t.Logf("stuck hook calls in one completion: %d, recorded hook_attempts: %d, batch took %s (HookTimeout %s)",
		stuckCalls.Load(), hookAttempts, elapsed, timeout)
	require.Equal(t, "done", *h.work(other).hook)
	require.Equal(t, int64(1), stuckCalls.Load(), "the stuck call is retried with the hook backoff, not again at once")
	require.Less(t, elapsed, 2*timeout, "org-b's completion waited for org-a's stuck hook twice")
	require.Equal(t, 1, hookAttempts)
}

// slowStatementsHook runs three statements of 0.8 × HookTimeout each under
// its context: no statement reaches the statement timeout, but the call
// outlasts HookTimeout + 1 s, so its context ends mid-statement.
func slowStatementsHook(timeout time.Duration) Hook {
	return func(ctx context.Context, tx pgx.Tx, c Completion) error {
		for range 3 {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, (timeout * 8 / 10).Seconds()); err != nil {
				return err
			}
		}
		return nil
	}
}

// "A call past it fails like any failed call — rolled back to the
// savepoint, retried with the hook backoff — and the completion commits"
// (docs/workpool.md). A hook whose statements are each within the
// statement timeout but whose call outlasts HookTimeout + 1 s had its
// context end mid-statement: pgx closed the connection, and the whole
// completing transaction was lost instead of the call failing alone; so
// did the same statements in a transaction the hook began in its own
// (pgx.BeginFunc: a savepoint), once the first was fixed. Both found by
// review.
func TestAHookSlowAcrossSeveralStatementsFailsAloneAndTheCompletionCommits(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	slow := slowStatementsHook(timeout)
	for name, hook := range map[string]Hook{
		"on its transaction": slow,
		"in a transaction nested in it": func(ctx context.Context, tx pgx.Tx, c Completion) error {
			return pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error { return slow(ctx, tx, c) })
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.HookTimeout = timeout })
			h.m.RegisterHook("slow", hook)
			id := h.enqueue(withHook("slow", `{}`))
			h.runMain()

			err := <-h.completeAsync(id)

			require.NoError(t, err, "the hook call fails, not the completion")
			w := h.work(id)
			require.Equal(t, "finished", w.state)
			require.Equal(t, "retry", *w.hook)
		})
	}
}

// The same hook on a running replica: the completer retried the lost batch
// for good (the hook called again each time), so the work never finished,
// and another org's completion on the replica waited behind it.
func TestASlowHookDoesNotStallTheReplicasCompletionsForEveryOrg(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, HookTimeout: timeout})
	var calls atomic.Int64
	slow := slowStatementsHook(timeout)
	m.RegisterHook("slow", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		return slow(ctx, tx, c)
	})
	m.RegisterHook("fine", func(context.Context, pgx.Tx, Completion) error { return nil })
	ctx := context.Background()
	a, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-a", Pool: "default", Handler: "noop", OnComplete: &OnComplete{Hook: "slow"}})
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // org-a's result is being recorded
	b, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-b", Pool: "default", Handler: "noop", OnComplete: &OnComplete{Hook: "fine"}})
	require.NoError(t, err)

	deadline := time.Now().Add(15 * time.Second)
	var sa, sb Status
	for time.Now().Before(deadline) {
		sa, _ = m.Status(ctx, "org-a", a)
		sb, _ = m.Status(ctx, "org-b", b)
		if sa.State == StateFinished && sb.State == StateFinished {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var hookState *string
	_ = db.QueryRow(ctx, `SELECT hook_state FROM workpool_work WHERE id = $1`, a).Scan(&hookState)
	t.Logf("after 15 s: org-a's work %s (hook_state %v), org-b's work %s; slow hook called %d times",
		sa.State, hookState, sb.State, calls.Load())
	require.Equal(t, StateFinished, sb.State, "org-b's completion is not held by org-a's slow hook")
	require.Equal(t, StateFinished, sa.State, "org-a's completion commits; its hook call is retried by the loop")
}

// "every statement of the transaction from the hooks' savepoint until they
// are done carries it as a statement timeout" (docs/workpool.md): the
// recording statement itself (sqlComplete) comes before that savepoint, yet
// completeIn set HookTimeout ahead of it, so recording a result that waited
// on a row lock (a loop iteration holding the row) for longer than
// HookTimeout failed the whole batch — every org's results in it. Found by
// review.
func TestTheRecordingStatementIsNotBoundByTheHookTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 100 * time.Millisecond })
	h.m.RegisterHook("fine", func(context.Context, pgx.Tx, Completion) error { return nil })
	id := h.enqueue(withHook("fine", `{}`))
	h.runMain()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM workpool_work WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	go func() { time.Sleep(400 * time.Millisecond); _ = lock.Rollback(h.ctx) }()

	err = <-h.completeAsync(id)

	require.NoError(t, err, "the recording waits for the row; only hook calls are bound by HookTimeout")
	require.Equal(t, "finished", h.work(id).state)
}

// A record's transaction waits in Go while its hooks run: the session's
// own idle bound (db.IdleInTransaction: the service's connections are
// ended by the server after 30 s idle in a transaction, so that a replica
// frozen in a spend does not hold the mandate; 1 s here) must not end a
// record whose hook call is within HookTimeout — it would fail the record,
// and every retry of it, for good.
func TestARecordsHookWaitingInGoOutlastsTheSessionsIdleBound(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 5 * time.Second })
	h.exec(`DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L',
		current_database(), '1s'); END$$`)
	h.db.Reset() // (a database's settings reach new sessions)
	var bound string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&bound))
	require.Equal(t, "1s", bound)
	var calls atomic.Int64
	h.m.RegisterHook("slow", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		select { // e.g. an outbound call that takes 2 s, honouring its context
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	id := h.enqueue(withHook("slow", `{}`))
	h.runMain()

	require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: id, pool: "default", attempt: 1, kind: kindSucceeded}})
		return err
	}), "a hook call within HookTimeout must not fail its record")
	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.NotNil(t, w.hook)
	require.Equal(t, "done", *w.hook, "the hook's call committed with the record")
	require.EqualValues(t, 1, calls.Load())
}

// docs/workpool.md: "A hook that ignores its context and blocks outside the
// database is not bounded" — on a session without an idle bound (a library
// user's pool; a DATABASE_URL that sets 0) such a call fails at the hook
// timeout once it returns, and the completion commits: the record sets no
// idle bound of its own there. (A review proved that setting one made the
// server end the record, and the completer record it again, calling the
// hook again, for good.)
func TestARecordWhoseHookIgnoresItsContextOnASessionWithoutAnIdleBoundStillCommits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = time.Second })
	var bound string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&bound))
	require.Equal(t, "0", bound, "the session itself has no idle bound")
	var calls atomic.Int64
	h.m.RegisterHook("deaf", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			time.Sleep(h.m.idleLimitWithHooks() + 2*time.Second) // ignores ctx (e.g. a client without a timeout)
		}
		return nil
	})
	id := h.enqueue(withHook("deaf", `{}`))
	h.runMain()

	_, err := h.m.recordWithHooks(h.ctx, []attemptResult{{id: id, pool: "default", attempt: 1, kind: kindSucceeded, result: json.RawMessage(`null`)}})
	require.NoError(t, err, "the completion commits; the slow call fails at the hook timeout and is retried later")
	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.EqualValues(t, 1, calls.Load())
}

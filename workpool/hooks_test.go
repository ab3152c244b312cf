package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestHooks_FireExactlyOnceForSuccessFinalFailureCancelBeforeStartAndCancelWhileRunning(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	hookTable(t, db)
	m.RegisterHook("record", recordHook)
	m.Register("ok", func(context.Context, Job) (json.RawMessage, error) { return json.RawMessage(`1`), nil })
	m.Register("fail", func(context.Context, Job) (json.RawMessage, error) { return nil, errors.New("nope") })
	started, ended := make(chan uuid.UUID, 1), make(chan error, 1)
	m.Register("block", blockingHandler(started, ended))
	ctx := context.Background()
	enqueue := func(handler string, runAt time.Time) uuid.UUID {
		id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: handler, RunAt: runAt,
			Retry: &RetryPolicy{MaxAttempts: 2, InitialBackoffMS: 1, Base: 1}, OnComplete: &OnComplete{Hook: "record"}})
		require.NoError(t, err)
		return id
	}

	success := enqueue("ok", time.Time{})
	failure := enqueue("fail", time.Time{})
	beforeStart := enqueue("ok", time.Now().Add(time.Hour))
	require.NoError(t, m.Cancel(ctx, "org-1", beforeStart))
	whileRunning := enqueue("block", time.Time{})
	require.Equal(t, whileRunning, <-started)
	require.NoError(t, m.Cancel(ctx, "org-1", whileRunning))

	for id, want := range map[uuid.UUID]Outcome{success: OutcomeSucceeded, failure: OutcomeFailed,
		beforeStart: OutcomeCanceled, whileRunning: OutcomeCanceled} {
		requireFinished(t, m, "org-1", id, want)
		require.Eventually(t, func() bool { n, _ := hookCallsOf(t, db, id); return n > 0 }, testWait, testTick)
		n, outcome := hookCallsOf(t, db, id)
		require.Equal(t, 1, n, "hook calls for %s work", want)
		require.Equal(t, string(want), outcome)
	}
	require.Equal(t, 2, requireFinished(t, m, "org-1", failure, OutcomeFailed).Attempts, "the failure was retried first")
}

func TestHooks_AFailingHookIsRetriedAndTheCompletionIsNotLost(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	hookTable(t, db)
	var calls atomic.Int64
	var allow atomic.Bool
	m.RegisterHook("flaky", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		if err := recordHook(ctx, tx, c); err != nil {
			return err
		}
		if !allow.Load() {
			return errors.New("downstream unavailable") // its write above is rolled back
		}
		return nil
	})
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		OnComplete: &OnComplete{Hook: "flaky"}})
	require.NoError(t, err)

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Eventually(t, func() bool { return calls.Load() >= 2 }, testWait, testTick, "the loop retries the hook")
	var state string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT hook_state FROM workpool_work WHERE id = $1`, id).Scan(&state))
	require.Equal(t, "retry", state)
	n, _ := hookCallsOf(t, db, id)
	require.Zero(t, n, "a failed call's writes do not commit")

	allow.Store(true)

	require.Eventually(t, func() bool {
		err := db.QueryRow(context.Background(), `SELECT hook_state FROM workpool_work WHERE id = $1`, id).Scan(&state)
		return err == nil && state == "done"
	}, testWait, testTick)
	n, _ = hookCallsOf(t, db, id)
	require.Equal(t, 1, n)
	require.Equal(t, OutcomeSucceeded, requireFinished(t, m, "org-1", id, OutcomeSucceeded).Outcome)
}

// A hook's error may quote what it read (NUL, bytes that are not UTF-8);
// Postgres text refuses both, and writing such an error as the hook's
// failure used to fail that statement at every retry: the hook was never
// retried and the work's completion never committed.
func TestHooks_AHookErrorPostgresTextCannotHoldIsRecordedAndRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		err       error
		wantError string
	}{
		{"error with NUL", errors.New("bad\x00byte"), "bad\uFFFDbyte"},
		{"error that is not UTF-8", errors.New("bad\xffbyte"), "bad\uFFFDbyte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 2}})
			hookTable(t, db)
			var allow atomic.Bool
			m.RegisterHook("quoting", func(ctx context.Context, tx pgx.Tx, c Completion) error {
				if !allow.Load() {
					return tc.err
				}
				return recordHook(ctx, tx, c)
			})
			id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
				OnComplete: &OnComplete{Hook: "quoting"}})
			require.NoError(t, err)

			requireFinished(t, m, "org-1", id, OutcomeSucceeded)
			var state string
			var hookErr *string
			require.Eventually(t, func() bool {
				err := db.QueryRow(context.Background(), `SELECT hook_state, hook_error FROM workpool_work WHERE id = $1`, id).Scan(&state, &hookErr)
				return err == nil && state == "retry"
			}, testWait, testTick, "the failed call is scheduled for a retry")
			require.NotNil(t, hookErr)
			require.Contains(t, *hookErr, tc.wantError)

			allow.Store(true)
			require.Eventually(t, func() bool {
				err := db.QueryRow(context.Background(), `SELECT hook_state FROM workpool_work WHERE id = $1`, id).Scan(&state)
				return err == nil && state == "done"
			}, testWait, testTick, "the retried call succeeds")
			n, _ := hookCallsOf(t, db, id)
			require.Equal(t, 1, n)
		})
	}
}

// A hook that ignores a database error leaves the transaction failed: that
// is a failed hook call (retried), never a completion silently rolled back.
func TestHooks_AHookThatSwallowsADatabaseErrorFailsAndIsRetried(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	hookTable(t, db)
	var calls atomic.Int64
	m.RegisterHook("swallow", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if calls.Add(1) == 1 {
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // the error is dropped
			return nil
		}
		return recordHook(ctx, tx, c)
	})
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		OnComplete: &OnComplete{Hook: "swallow"}})
	require.NoError(t, err)

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Eventually(t, func() bool {
		var state string
		err := db.QueryRow(context.Background(), `SELECT hook_state FROM workpool_work WHERE id = $1`, id).Scan(&state)
		return err == nil && state == "done"
	}, testWait, testTick, "the retried call succeeds")
	var hookErr *string
	var hookAttempts int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT hook_error, hook_attempts FROM workpool_work WHERE id = $1`, id).Scan(&hookErr, &hookAttempts))
	require.Equal(t, 1, hookAttempts, "the first call counted as failed")
	n, _ := hookCallsOf(t, db, id)
	require.Equal(t, 1, n)
}

func TestHooks_OneFailingHookInABatchDoesNotHoldBackTheOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	hookTable(t, h.db)
	var bad uuid.UUID
	var fail atomic.Bool
	fail.Store(true)
	h.m.RegisterHook("record", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if err := recordHook(ctx, tx, c); err != nil {
			return err
		}
		if c.WorkID == bad && fail.Load() {
			return errors.New("this one fails")
		}
		return nil
	})
	var ids []uuid.UUID
	for range 5 {
		ids = append(ids, h.enqueue(withHook("record", `{}`)))
	}
	bad = ids[2]
	h.runMain()
	var batch []attemptResult
	for _, id := range ids {
		batch = append(batch, attemptResult{id: id, pool: "default", attempt: 1, kind: kindSucceeded})
	}

	require.NoError(t, pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		_, err := h.m.completeTx(h.ctx, tx, batch)
		return err
	}))

	for _, id := range ids {
		require.Equal(t, "succeeded", *h.work(id).outcome)
		n, _ := hookCallsOf(t, h.db, id)
		if id == bad {
			require.Zero(t, n)
			require.Equal(t, "retry", *h.work(id).hook)
		} else {
			require.Equal(t, 1, n)
			require.Equal(t, "done", *h.work(id).hook)
		}
	}

	fail.Store(false)
	h.clock.Advance(time.Minute)
	h.runMain()
	n, _ := hookCallsOf(t, h.db, bad)
	require.Equal(t, 1, n)
	require.Equal(t, "done", *h.work(bad).hook)
}

func TestHooks_APanickingHookIsRetriedLikeAFailingOne(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls int
	h.m.RegisterHook("panics", func(context.Context, pgx.Tx, Completion) error {
		calls++
		if calls == 1 {
			panic("hook bug")
		}
		return nil
	})
	id := h.enqueue(withHook("panics", `{}`))
	h.runMain()

	h.complete(id, "success", 1)

	require.Equal(t, "retry", *h.work(id).hook)
	var msg string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT hook_error FROM workpool_work WHERE id = $1`, id).Scan(&msg))
	require.Contains(t, msg, "panicked")
	h.clock.Advance(time.Minute)
	h.runMain()
	require.Equal(t, "done", *h.work(id).hook)
	require.Equal(t, 2, calls)
}

func TestHooks_AHookRetryWaitsForItsBackoff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookRetryBackoff = 10 * time.Second })
	var calls int
	h.m.RegisterHook("once-failing", func(context.Context, pgx.Tx, Completion) error {
		calls++
		if calls == 1 {
			return errors.New("first call fails")
		}
		return nil
	})
	id := h.enqueue(withHook("once-failing", `{}`))
	h.runMain()
	failedAt := h.clock.Now()
	h.complete(id, "success", 1)
	h.runMain() // frees the slot
	h.clock.Advance(DefaultCooldown + time.Second)

	res := h.runMain() // nothing to do: the hook retry is the next timer

	require.Equal(t, 1, calls, "not retried before its backoff")
	require.Equal(t, "scheduled", h.observe().runStatus.Kind)
	require.True(t, res.wakeAt.Equal(failedAt.Add(10*time.Second)), "wakes for the retry: %v", res.wakeAt.Sub(failedAt))
	h.clock.Advance(res.wakeAt.Sub(h.clock.Now()))
	h.runMain()
	require.Equal(t, 2, calls)
	require.Equal(t, "done", *h.work(id).hook)
}

func TestHooks_RetentionKeepsWorkWhoseHookStillWaits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.m.RegisterHook("broken", func(context.Context, pgx.Tx, Completion) error { return errors.New("always") })
	keep := h.enqueue(withHook("broken", `{}`))
	purge := h.enqueue()
	h.runMain()
	h.complete(keep, "success", 1)
	h.complete(purge, "success", 1)
	h.clock.Advance(DefaultWorkRetention + time.Hour)

	n, err := h.l.purge(h.ctx)

	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, err = h.m.Status(h.ctx, "org-1", purge)
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, StateFinished, h.status(keep).State)
}

// completeAsync records one successful attempt of id the way the completer
// does, in a goroutine; the channel gets its error.
func (h *harness) completeAsync(id uuid.UUID) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
			_, err := h.m.completeTx(h.ctx, tx, []attemptResult{{id: id, pool: "default", attempt: 1, kind: kindSucceeded, result: json.RawMessage(`null`)}})
			return err
		})
	}()
	return done
}

// A hook that cannot return in time fails at the hook timeout, like any
// failed call: the completion commits and the call is retried later — one
// stuck hook does not hold up every completion this replica records. A
// hook waiting on a lock fails on the statement timeout (the transaction
// stays usable from the hooks' savepoint on); one that waits in Go, on
// its context.
func TestHooks_AHookThatCannotReturnFailsAtTheHookTimeoutAndIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		hook         func(context.Context, pgx.Tx, Completion) error
	}{
		{"waiting on a row lock", "statement timeout", func(ctx context.Context, tx pgx.Tx, _ Completion) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
			return err
		}},
		{"waiting on its context", "did not return within the hook timeout", func(ctx context.Context, _ pgx.Tx, _ Completion) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Minute):
				return nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.HookTimeout = 200 * time.Millisecond })
			h.exec(`CREATE TABLE test_hook_lock (id int PRIMARY KEY)`)
			h.exec(`INSERT INTO test_hook_lock VALUES (1)`)
			var stuck atomic.Bool
			stuck.Store(true)
			h.m.RegisterHook("stuck", func(ctx context.Context, tx pgx.Tx, c Completion) error {
				if stuck.Load() {
					return tc.hook(ctx, tx, c)
				}
				return nil
			})
			id := h.enqueue(withHook("stuck", `{}`))
			h.runMain()
			lock, err := h.db.Begin(h.ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(h.ctx) }()
			_, err = lock.Exec(h.ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
			require.NoError(t, err)

			select {
			case err := <-h.completeAsync(id):
				require.NoError(t, err)
			case <-time.After(testWait):
				t.Fatal("the completion still waits on the hook")
			}
			w := h.work(id)
			require.Equal(t, "finished", w.state, "the completion committed")
			require.Equal(t, "retry", *w.hook)
			var msg string
			require.NoError(t, h.db.QueryRow(h.ctx, `SELECT hook_error FROM workpool_work WHERE id = $1`, id).Scan(&msg))
			require.Contains(t, msg, tc.reason)

			stuck.Store(false)
			require.NoError(t, lock.Rollback(h.ctx))
			h.clock.Advance(time.Minute)
			h.runMain()
			require.Equal(t, "done", *h.work(id).hook, "the retry ran")
		})
	}
}

// The hooks' statement timeout is set in the transaction that runs them;
// in the loop's own transaction the starts come after them and must not
// inherit a bound meant for a hook (a start that takes longer would fail
// the iteration, and the leader would stand down).
func TestHooks_TheHookTimeoutDoesNotBoundTheIterationsStartsAfterThem(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before leaves work for the iteration to finish ahead of its
		// start, and returns it with the state it ends in
		before func(h *harness) (uuid.UUID, string)
	}{
		{"a canceled item's hook", func(h *harness) (uuid.UUID, string) {
			id := h.enqueue(withHook("noop", `{}`), withRunAt(h.clock.Now().Add(time.Hour)))
			h.cancel(id)
			return id, "finished"
		}},
		{"a silent executor's work recovered", func(h *harness) (uuid.UUID, string) {
			id := h.s2RunningWithRetries()
			h.claimAll()
			h.pastRecovery()
			return id, "pending"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.HookTimeout = 100 * time.Millisecond })
			h.m.RegisterHook("noop", func(context.Context, pgx.Tx, Completion) error { return nil })
			finished, state := tc.before(h)
			due := h.enqueue()
			// A start slower than a hook may be (a trigger stands in for
			// a busy database).
			h.exec(`CREATE FUNCTION test_slow_start() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$`)
			h.exec(`CREATE TRIGGER test_slow_start BEFORE UPDATE ON workpool_work
				FOR EACH ROW WHEN (NEW.state = 'running') EXECUTE FUNCTION test_slow_start()`)

			_, err := h.l.iterateFull(h.ctx)
			require.NoError(t, err, "a start may take as long as any loop statement")
			require.Equal(t, state, h.work(finished).state)
			require.Equal(t, "running", h.work(due).state)
		})
	}
}

// The full iteration is one transaction holding the pool row: a leader
// lost in its middle would leave it open on the server, and the next
// leader's takeover would wait on the row until TCP gave up on the peer.
// Its idle time is bounded, as a leader's fenced write's is: a hook the
// loop retries runs in it and reads the bound.
func TestTheLoopsIterationBoundsItsTransactionsIdleTime(t *testing.T) {
	t.Parallel()
	_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	var calls atomic.Int64
	seen := make(chan string, 1)
	m.RegisterHook("probe", func(ctx context.Context, tx pgx.Tx, _ Completion) error {
		if calls.Add(1) == 1 {
			return errors.New("the first call fails: the loop retries it")
		}
		var bound string
		if err := tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&bound); err != nil {
			return err
		}
		select {
		case seen <- bound:
		default:
		}
		return nil
	})
	_, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		OnComplete: &OnComplete{Hook: "probe"}})
	require.NoError(t, err)
	select {
	case bound := <-seen:
		require.Equal(t, "30s", bound)
	case <-time.After(testWait):
		t.Fatal("the loop never retried the hook")
	}
}

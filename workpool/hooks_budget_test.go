package workpool

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// waitInGo is a hook that spends d in Go (an outbound call honouring its
// context), running no statement.
func waitInGo(d time.Duration) Hook {
	return func(ctx context.Context, tx pgx.Tx, c Completion) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		return nil
	}
}

// The loop's transaction may sit idle on the server for 30 s or the hook
// timeout and 11 s — sized for one hook call. The hooks of canceled
// pending work ran back to back in it with no statement between them, so
// the idle time added up across calls: four canceled items whose hooks
// each take 8 s (default HookTimeout 10 s) ended the iteration, and every
// next one, with the cancelations rolled back. A statement follows a long
// call now, and the calls past the iteration's hook budget wait in the
// retry queue. Found by review.
func TestSeveralHooksEachWithinTheHookTimeoutDoNotEndTheIteration(t *testing.T) {
	t.Parallel()
	h := newHarness(t) // default HookTimeout: 10 s
	h.m.RegisterHook("slow", waitInGo(8*time.Second))
	ids := h.canceledWithHook("slow", 4)

	t0 := time.Now()
	_, err := h.l.iterateFull(h.ctx)
	t.Logf("iteration took %s: %v", time.Since(t0), err)

	require.NoError(t, err, "hook calls each within HookTimeout must not fail the loop's iteration")
	for _, id := range ids {
		w := h.work(id)
		require.Equal(t, "finished", w.state)
		require.Contains(t, []string{"done", "retry"}, *w.hook, "called, or due in the retry queue")
	}
}

// The same through the loop's hook retries: a call begun just before the
// budget's end may itself take up to HookTimeout + 1 s, so one call of
// 19 s followed by another of 19 s (HookTimeout 20 s, idle limit 31 s)
// idled the iteration's transaction for 38 s and the server ended it.
// Found by review.
func TestHookRetriesWithinTheBudgetDoNotEndTheIteration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 20 * time.Second })
	var mu sync.Mutex
	seen := map[uuid.UUID]bool{}
	slow := waitInGo(19 * time.Second)
	h.m.RegisterHook("flaky", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		mu.Lock()
		first := !seen[c.WorkID]
		seen[c.WorkID] = true
		mu.Unlock()
		if first {
			return context.Canceled // fails at once: a retry is scheduled
		}
		return slow(ctx, tx, c)
	})
	a := h.enqueue(withHook("flaky", `{}`))
	b := h.enqueue(withHook("flaky", `{}`))
	h.runMain()
	_ = h.complete(a, "success", 1)
	_ = h.complete(b, "success", 1)
	require.Equal(t, "retry", *h.work(a).hook)
	require.Equal(t, "retry", *h.work(b).hook)
	h.clock.Advance(time.Hour) // both retries due
	h.l.nextHookAt = h.clock.Now().Add(-time.Second)

	t0 := time.Now()
	_, err := h.l.iterateFull(h.ctx)
	t.Logf("iteration took %s: %v", time.Since(t0), err)

	require.NoError(t, err, "hook retries each within HookTimeout must not fail the loop's iteration")
	require.Equal(t, "done", *h.work(a).hook)
}

// A loop whose leadership ends (Stop at SIGTERM, a lost lock connection)
// cancels its context: an iteration blocked in a hook's statement ends at
// once. (d27bdd5 ran hooks' statements under context.WithoutCancel, and
// the iteration — holding the pool row, the leadership not handed over —
// ran on until the statement timeout, HookTimeout, up to an hour: found by
// review.)
func TestALoopsCanceledContextEndsAHookStatementPromptly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 8 * time.Second })
	h.exec(`CREATE TABLE test_hook_lock (id int PRIMARY KEY)`)
	h.exec(`INSERT INTO test_hook_lock VALUES (1)`)
	var stuck atomic.Bool
	h.m.RegisterHook("stuck", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		if !stuck.Load() {
			return context.Canceled // fails at once: a retry is scheduled
		}
		_, err := tx.Exec(ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
		return err
	})
	id := h.enqueue(withHook("stuck", `{}`))
	h.runMain()
	_ = h.complete(id, "success", 1)
	require.Equal(t, "retry", *h.work(id).hook)
	stuck.Store(true)
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(h.ctx) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)
	h.clock.Advance(time.Hour)
	h.l.nextHookAt = h.clock.Now().Add(-time.Second)

	ctx, cancel := context.WithCancel(h.ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	t0 := time.Now()
	_, err = h.l.iterateFull(ctx)
	elapsed := time.Since(t0)
	t.Logf("iteration returned after %s (context canceled at 300ms): %v", elapsed, err)
	require.Less(t, elapsed, 2*time.Second, "the canceled loop's iteration ran on in the hook's statement")
}

// A batch where one item's result is refused still bounds the
// hooks and restores the caller's statement timeout.
func TestARecordingTakenApartStillBoundsItsHooksAndRestoresTheTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 300 * time.Millisecond })
	h.exec(`CREATE TABLE test_hook_lock (id int PRIMARY KEY)`)
	h.exec(`INSERT INTO test_hook_lock VALUES (1)`)
	h.m.RegisterHook("stuck", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		_, err := tx.Exec(ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
		return err
	})
	a := h.enqueue()
	b := h.enqueue(withHook("stuck", `{}`))
	h.runMain()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(h.ctx) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)
	var after string
	t0 := time.Now()
	err = pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(h.ctx, `SET LOCAL statement_timeout = '12345ms'`); err != nil {
			return err
		}
		_, err := h.m.completeTx(h.ctx, tx, []attemptResult{
			{id: a, pool: "default", attempt: 1, kind: kindSucceeded, result: []byte(`"\u0000"`)},
			{id: b, pool: "default", attempt: 1, kind: kindSucceeded, result: []byte(`null`)},
		})
		if err != nil {
			return err
		}
		return tx.QueryRow(h.ctx, `SHOW statement_timeout`).Scan(&after)
	})
	t.Logf("took %s, timeout after %q, err %v; a outcome=%s", time.Since(t0), after, err, *h.work(a).outcome)
	require.NoError(t, err)
	require.Less(t, time.Since(t0), 3*time.Second)
	require.Equal(t, "12345ms", after)
	require.Equal(t, "finished", h.work(a).state)
	require.Equal(t, "retry", *h.work(b).hook)
}

// "Nothing one org asks for may stall the pool's main loop"
// (docs/workpool.md): the loop calls hooks in the transaction that holds
// the pool row, before its starts — the retries of completed work's hooks,
// and the hooks of canceled work — and one org's stuck hooks held every
// org's starts for HookTimeout each, up to 100 of them. They share the
// iteration's hook budget now; the calls past it wait in the retry queue.
// Both found by review.
func TestOneOrgsStuckHooksDoNotHoldAnotherOrgsStarts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	const stuck = 10
	for _, tc := range []struct {
		name string
		// org-a's stuck hook calls, due at the next iteration
		due func(h *harness)
	}{
		{"retries of its completed work", func(h *harness) {
			var ids []uuid.UUID
			for range stuck {
				ids = append(ids, h.enqueue(withHook("stuck", `{}`), withOrg("org-a")))
			}
			h.runMain()
			for _, id := range ids {
				_ = h.complete(id, "success", 1) // each hook call fails at the timeout: retry
				require.Equal(h.t, "retry", *h.work(id).hook)
			}
			h.clock.Advance(time.Hour) // retries due
		}},
		{"its canceled work", func(h *harness) {
			for range stuck {
				id := h.enqueue(withHook("stuck", `{}`), withOrg("org-a"), withRunAt(h.clock.Now().Add(time.Hour)))
				require.NoError(h.t, h.m.Cancel(h.ctx, "org-a", id))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.HookTimeout = timeout })
			h.exec(`CREATE TABLE test_hook_lock (id int PRIMARY KEY)`)
			h.exec(`INSERT INTO test_hook_lock VALUES (1)`)
			var calls atomic.Int64
			h.m.RegisterHook("stuck", func(ctx context.Context, tx pgx.Tx, c Completion) error {
				calls.Add(1)
				_, err := tx.Exec(ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
				return err
			})
			lock, err := h.db.Begin(h.ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(h.ctx) }()
			_, err = lock.Exec(h.ctx, `SELECT 1 FROM test_hook_lock WHERE id = 1 FOR UPDATE`)
			require.NoError(t, err)
			tc.due(h)
			calls.Store(0)
			b := h.enqueue(withOrg("org-b"))

			t0 := time.Now()
			_, err = h.l.iterateFull(h.ctx)
			elapsed := time.Since(t0)
			require.NoError(t, err)
			t.Logf("org-b's start waited %s behind %d hook calls of org-a (HookTimeout %s)", elapsed, calls.Load(), timeout)
			require.Equal(t, "running", h.work(b).state)
			require.Less(t, elapsed, time.Duration(stuck)*timeout, "org-b's start waited for every stuck hook of org-a")
		})
	}
}

// canceledWithHook enqueues n items of org-1 with onComplete hook, due in
// an hour, and cancels them: the loop's next full iteration finishes them
// as canceled and calls their hooks in its transaction.
func (h *harness) canceledWithHook(hook string, n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = h.enqueue(withHook(hook, `{}`), withRunAt(h.clock.Now().Add(time.Hour)))
		h.cancel(ids[i])
	}
	return ids
}

// runUntilHooksDone runs the loop, the clock a step further each time, until
// every item of ids has its hook call done (at most tries times).
func (h *harness) runUntilHooksDone(ids []uuid.UUID, step time.Duration, tries int) {
	for range tries {
		h.clock.Advance(step)
		h.runMain()
		if !slices.ContainsFunc(ids, func(id uuid.UUID) bool { return *h.work(id).hook != "done" }) {
			return
		}
	}
}

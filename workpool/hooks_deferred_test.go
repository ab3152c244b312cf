package workpool

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// The server counts a transaction's idle time from its last statement:
// calls under a second each got no statement after them, so with
// HookTimeout 20 s (idle limit 31 s) fourteen 0.95 s calls, then one of
// 19.5 s — every one within its timeout and the budget — idled the loop's
// transaction ~33 s and the server ended it. A statement follows once a
// second has passed since the last. Found by review.
func TestHookCallsUnderASecondEachDoNotAddUpPastTheIdleLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 20 * time.Second })
	var n atomic.Int64
	h.m.RegisterHook("webhook", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		d := 950 * time.Millisecond
		if n.Add(1) == 15 {
			d = 19500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		return nil
	})
	ids := h.canceledWithHook("webhook", 16)
	t0 := time.Now()
	_, err := h.l.iterateFull(h.ctx)
	t.Logf("iteration took %s, %d calls: %v", time.Since(t0), n.Load(), err)
	require.NoError(t, err, "hook calls each within HookTimeout, begun within the budget, must not end the loop's iteration")
	for _, id := range ids {
		require.Equal(t, "finished", h.work(id).state, "the cancelations committed")
	}
}

// The calls a loop's iteration does not make in its hook budget wait in the
// retry queue, due at once, for the next iteration. The deferring
// iteration did work, so it read no outlook and the loop's next hook time
// stayed unset: the next iteration was a fast one that made no hook call
// and slept to the cooldown's end (on a pool busy with fast starts, until
// the next RecoveryPeriod). Found by review.
func TestDeferredHookCallsAreMadeByTheNextIteration(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.HookTimeout = timeout })
	var calls atomic.Int64
	h.m.RegisterHook("slowish", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	ids := h.canceledWithHook("slowish", 6)
	_, err := h.l.iterateFull(h.ctx)
	require.NoError(t, err)
	first := calls.Load()
	deferred := 0
	for _, id := range ids {
		if *h.work(id).hook == "retry" {
			deferred++
		}
	}
	t.Logf("first iteration: %d calls, %d deferred; nextHookAt=%v", first, deferred, h.l.nextHookAt)
	require.Greater(t, deferred, 0)

	h.clock.Advance(10 * time.Millisecond)
	res := h.runMain()
	t.Logf("next iteration: calls now %d, didWork=%v wakeAt in %s (fake clock)", calls.Load(), res.didWork, res.wakeAt.Sub(h.clock.Now()))
	require.Greater(t, calls.Load(), first, "the deferred calls, due at once, were not made by the next iteration")
}

// The same on a pool busy with fast starts: the deferred calls waited for
// the next recovery (RecoveryPeriod, 10 s by default). Found by review.
func TestDeferredHookCallsDoNotWaitForRecoveryOnABusyPool(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.HookTimeout = timeout; c.Pools = map[string]int{"default": 1000} })
	var calls atomic.Int64
	h.m.RegisterHook("slowish", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	h.clock.Advance(time.Minute) // past the term's first heartbeat timeout
	h.canceledWithHook("slowish", 6)
	_, err := h.l.iterateFull(h.ctx)
	require.NoError(t, err)
	first := calls.Load()
	start := h.clock.Now()
	for calls.Load() == first && h.clock.Now().Sub(start) < time.Minute {
		h.clock.Advance(500 * time.Millisecond)
		h.enqueue() // a busy pool: something to start every iteration
		h.runMain()
	}
	t.Logf("deferred calls made %s (fake) after they were deferred", h.clock.Now().Sub(start))
	require.Less(t, h.clock.Now().Sub(start), 2*time.Second, "deferred calls, due at once, waited")
}

// Every call is made once, and the after-commit actions of hooks (one over
// a second, one in a nested transaction) run; deferred ones too.
func TestDeferredHookCallsAreMadeOnceAndTheirAfterCommitActionsRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HookTimeout = 1500 * time.Millisecond })
	var mu sync.Mutex
	calls := map[uuid.UUID]int{}
	ran := map[uuid.UUID]int{}
	h.m.RegisterHook("h", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		mu.Lock()
		calls[c.WorkID]++
		mu.Unlock()
		time.Sleep(1100 * time.Millisecond)
		return pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			AfterCommit(ctx, func() { mu.Lock(); ran[c.WorkID]++; mu.Unlock() })
			return nil
		})
	})
	ids := h.canceledWithHook("h", 4)
	h.runUntilHooksDone(ids, 3*time.Second, 20)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, "done", *h.work(id).hook)
		require.Equal(t, 1, calls[id], "calls")
		require.Equal(t, 1, ran[id], "after-commit actions")
	}
}

// reveille_workpool_hook_retries_total is "retried hook calls"
// (docs/operations.md; an alert on failures): a first call the loop
// deferred for its budget — never failed, no attempt counted — was counted
// as a retry when it was finally made. Found by review.
func TestDeferredFirstCallsAreNotCountedAsRetries(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	h := newHarness(t, func(c *Config) { c.HookTimeout = timeout })
	h.m.RegisterHook("slowish", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	ids := h.canceledWithHook("slowish", 6)
	h.runUntilHooksDone(ids, time.Second, 30)
	failed := testutil.ToFloat64(h.m.metrics.hookCalls.WithLabelValues("default", "failed"))
	ok := testutil.ToFloat64(h.m.metrics.hookCalls.WithLabelValues("default", "ok"))
	retries := testutil.ToFloat64(h.m.metrics.hookRetries.WithLabelValues("default"))
	t.Logf("hook_calls ok=%v failed=%v, hook_retries=%v", ok, failed, retries)
	require.Zero(t, failed)
	require.Zero(t, retries, "no call failed, yet retries were counted")
}

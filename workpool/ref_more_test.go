package workpool

// Reference cases whose first ports tested less than the case does: each
// again, closer to the reference (docs/reference-port.md).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// 003 "S9 canceled+retrying -> does not retry, cancels instead". The
// reference's S9 is work whose cancelation was already processed while it
// ran (canceled, still running: S12) and whose attempt then failed
// retryably. (s9CanceledRetrying, the first port's, cancels work already
// pending for its retry: S10 + cancel, a different state.)
func TestRef003_S9CanceledWhileRunningThenARetryableFailure_FinishesCanceled(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		var got []Completion
		h.m.RegisterHook("record", func(_ context.Context, _ pgx.Tx, c Completion) error {
			got = append(got, c)
			return nil
		})
		id := h.s2Running(withRetry(5, 100, 2), withHook("record", `{}`))
		h.cancel(id)
		h.runMain() // S8 -> S12: canceled, still running
		require.True(t, h.work(id).canceled)
		require.True(t, h.observe().isRunning(id))

		done := h.complete(id, "failed", 1) // the attempt fails retryably
		require.Len(t, done, 1)

		w := h.work(id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "canceled", *w.outcome)
		h.clock.Advance(2 * time.Second)
		h.runMain()
		o := h.observe()
		require.False(t, o.isRunning(id))
		require.False(t, o.isPending(id))
		require.False(t, o.isCanceling(id))
		require.Len(t, got, 1)
		require.Equal(t, OutcomeCanceled, got[0].Outcome)
		r := h.m.report("default")
		require.Equal(t, int64(1), r.canceled)
		require.Zero(t, r.retries)
	})
}

// 003 "cancel arrives while retry completion is pending -> cancel wins":
// with the retry due when main runs (the first port ran main before it
// was, so the start could not have picked it anyway), the cancelation still
// wins, on both the fast and the full path.
func TestRef003_CancelOfARetryThatIsAlreadyDue_Wins(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		id := h.s5CompletingWillRetry()
		h.cancel(id)
		h.clock.Advance(2 * time.Second) // the retry is due

		h.runMain()
		h.runMain()

		o := h.observe()
		require.False(t, o.isPending(id))
		require.False(t, o.isRunning(id))
		require.False(t, o.isCanceling(id))
		w := h.work(id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "canceled", *w.outcome)
		require.Equal(t, 1, w.attempts, "the retry never started")
	})
}

// 002 "rejects main calls with the wrong generation" as a real stale leader
// meets it: an older generation, past its term's first iteration, on the
// fast path (the first port used a future generation on the always-full
// first iteration). It writes nothing.
func TestRef002_AStaleLeadersFastIterationWritesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.runMain() // the term's first, full iteration
	h.clock.Advance(time.Second)
	stale := h.l
	h.l = newLoop(h.m, "default")
	require.NoError(t, h.l.takeover(h.ctx)) // a new term fences the old one
	before := h.observe().generation
	id := h.enqueue()
	c := h.enqueue()
	h.cancel(c)

	_, err := stale.iterate(h.ctx)

	require.ErrorIs(t, err, errGenerationMismatch)
	o := h.observe()
	require.Equal(t, before, o.generation)
	require.ElementsMatch(t, []uuid.UUID{id, c}, o.pending)
	require.Equal(t, []uuid.UUID{c}, o.pendingCancelation)
	require.False(t, h.work(c).canceled)

	h.runMain()
	o = h.observe()
	require.Equal(t, []uuid.UUID{id}, o.running)
	require.Equal(t, "canceled", *h.work(c).outcome)
}

// 003 "S7 already cancel-pending + cancel -> no-op (dedup)" for running work
// whose cancelation was processed (S12): a second cancel does not change
// the outcome, count twice or run the hook again.
func TestRef003_S12CancelAgain_ChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls int
	h.m.RegisterHook("count", func(context.Context, pgx.Tx, Completion) error { calls++; return nil })
	id := h.s2Running(withHook("count", `{}`))
	h.cancel(id)
	h.runMain()
	h.cancel(id)
	h.runMain()
	h.complete(id, "success", 1)
	h.runMain()

	w := h.work(id)
	require.Equal(t, "canceled", *w.outcome)
	require.Equal(t, 1, calls)
	require.Equal(t, int64(1), h.m.report("default").canceled)
	require.Empty(t, h.observe().pendingCancelation)
}

// 003's interleavings (completions with retries, cancels of pending,
// retrying and running work, duplicate cancels) with the real loops,
// executors and completers of two replicas, several orgs: every item
// finishes once, its hook fires once with the row's outcome, no attempt
// runs twice, the pool's limit holds.
func TestRef003_InterleavedRetriesAndCancelsOnTwoReplicas(t *testing.T) {
	t.Parallel()
	const n, limit = 300, 8
	db := testkit.NewPool(t)
	hookTable(t, db)
	var running, peak atomic.Int64
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	handler := func(ctx context.Context, j Job) (json.RawMessage, error) {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		raisePeak(&peak, running.Add(1))
		defer running.Add(-1)
		select {
		case <-time.After(time.Duration(rand.IntN(4)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if rand.IntN(2) == 0 {
			return nil, errors.New("flaky")
		}
		return json.RawMessage(`{"ok":true}`), nil
	}
	ms := startRecordingReplicas(t, db, limit, handler)
	ps := make([]EnqueueParams, n)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: fmt.Sprintf("org-%d", i%3), Pool: "default", Handler: "work",
			OnComplete: &OnComplete{Hook: "record"},
			Retry:      &RetryPolicy{MaxAttempts: 4, InitialBackoffMS: 5, Base: 1}}
	}
	var ids []uuid.UUID
	for i := 0; i < n; i += 50 {
		got, err := ms[(i/50)%2].EnqueueMany(context.Background(), ps[i:i+50])
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 3 {
				if i%2 == 0 {
					continue
				}
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				m := ms[rand.IntN(2)]
				assert.NoError(t, m.Cancel(context.Background(), ps[i].OrgID, ids[i]))
				if i%5 == 0 {
					assert.NoError(t, m.Cancel(context.Background(), ps[i].OrgID, ids[i])) // again
				}
			}
		}()
	}
	wg.Wait()

	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&done))
		return done == n
	}, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		var hooked int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM hook_calls`).Scan(&hooked))
		return hooked == n
	}, 10*time.Second, 20*time.Millisecond)

	require.LessOrEqual(t, peak.Load(), int64(limit))
	rows, err := db.Query(context.Background(), `SELECT w.id, w.outcome, w.attempts, h.calls, h.outcome FROM workpool_work w JOIN hook_calls h ON h.work_id = w.id`)
	require.NoError(t, err)
	defer rows.Close()
	mu.Lock()
	defer mu.Unlock()
	outcomes := map[string]int{}
	for rows.Next() {
		var (
			id               uuid.UUID
			outcome, hookOut string
			attempts, calls  int
		)
		require.NoError(t, rows.Scan(&id, &outcome, &attempts, &calls, &hookOut))
		outcomes[outcome]++
		require.Equal(t, 1, calls, "hook calls of %s", id)
		require.Equal(t, outcome, hookOut, "hook outcome of %s", id)
		require.LessOrEqual(t, runs[id], attempts, "handler runs of %s vs attempts counted", id)
		require.LessOrEqual(t, attempts, 4)
	}
	require.NoError(t, rows.Err())
	t.Logf("outcomes: %v", outcomes)
}

// 002 lifecycle and saturated cases on a loop past its term's first
// iteration (the ports run them on the first, always full, iteration).
func TestRef002_LifecycleOnAWarmLoop(t *testing.T) {
	t.Parallel()
	warm := func(t *testing.T, opts ...harnessOpt) *harness {
		h := newHarness(t, opts...)
		h.runMain()
		h.clock.Advance(time.Second)
		h.runMain()
		return h
	}
	t.Run("idle past the cooldown", func(t *testing.T) {
		t.Parallel()
		h := warm(t)
		h.clock.Advance(DefaultCooldown + time.Second)
		res := h.runMain()
		require.Equal(t, "idle", h.observe().runStatus.Kind)
		require.True(t, res.wakeAt.IsZero())
	})
	t.Run("scheduled for future work", func(t *testing.T) {
		t.Parallel()
		h := warm(t)
		future := h.clock.Now().Add(100 * time.Second)
		h.enqueue(withRunAt(future))
		h.clock.Advance(DefaultCooldown + time.Second)
		res := h.runMain()
		o := h.observe()
		require.Equal(t, "scheduled", o.runStatus.Kind)
		require.False(t, o.runStatus.Saturated)
		require.NotNil(t, o.runStatus.At)
		require.False(t, o.runStatus.At.After(future))
		require.False(t, res.wakeAt.After(future))
		require.False(t, res.wakeAt.IsZero())
	})
	t.Run("future work of another org", func(t *testing.T) {
		t.Parallel()
		h := warm(t)
		h.enqueue(withOrg("org-a"), withRunAt(h.clock.Now().Add(time.Hour)))
		future := h.clock.Now().Add(100 * time.Second)
		h.enqueue(withOrg("org-b"), withRunAt(future))
		h.clock.Advance(DefaultCooldown + time.Second)
		res := h.runMain()
		require.False(t, res.wakeAt.After(future), "wakes at %s", res.wakeAt)
		require.False(t, res.wakeAt.IsZero())
	})
	t.Run("saturated, then a completion clears it, then refilled", func(t *testing.T) {
		t.Parallel()
		h := warm(t, withMaxParallelism(2))
		a, b := h.enqueue(), h.enqueue()
		h.runMain()
		h.clock.Advance(DefaultCooldown + time.Second)
		h.runMain()
		require.Equal(t, RunStatus{Kind: "scheduled", Saturated: true}, withoutAt(h.observe().runStatus))
		h.complete(a, "success", 1)
		h.runMain()
		h.clock.Advance(DefaultCooldown + time.Second)
		h.runMain()
		require.Equal(t, RunStatus{Kind: "scheduled", Saturated: false}, withoutAt(h.observe().runStatus))
		h.enqueue()
		h.enqueue()
		h.runMain()
		h.clock.Advance(DefaultCooldown + time.Second)
		h.runMain()
		o := h.observe()
		require.Len(t, o.running, 2)
		require.Contains(t, o.running, b)
		require.Equal(t, RunStatus{Kind: "scheduled", Saturated: true}, withoutAt(o.runStatus))
	})
}

package workpool

// Reference cases that had no Go counterpart, or whose counterpart asserted
// less than the reference does (a review of the port, session 21), and the
// cooldown's wake for work of another org or keyed work it found.
//
// TestRef046_* are the cases of the 0.4.6 suite (the "-" side of reference
// 002) that 0.4.7 dropped and that 001 does not have (docs/reference-port.md).

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

// 0.4.6 "status transitions: should transition from scheduled to running
// when main loop runs".
func TestRef046_ScheduledGoesRunningWhenMainRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	due := h.clock.Now().Add(10 * time.Second)
	id := h.enqueue(withRunAt(due))
	h.runMain()
	require.Equal(t, "scheduled", h.observe().runStatus.Kind)

	h.clock.Advance(10 * time.Second)
	res := h.runMain()

	o := h.observe()
	require.True(t, res.didWork)
	require.Equal(t, "running", o.runStatus.Kind)
	require.Equal(t, "running", res.status.Kind)
	require.False(t, o.runStatus.Saturated)
	require.Nil(t, o.runStatus.At, "a running loop publishes no wake time")
	require.True(t, o.isRunning(id))
}

// 0.4.6 "status cooldown: should stay running within the cooldown window"
// (the work started is still running, nothing else to do).
func TestRef046_StaysRunningWithinTheCooldownWindowWhileWorkRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain() // starts it: activity now
	start := h.clock.Now()
	h.clock.Advance(DefaultCooldown - time.Second)

	res := h.runMain()

	require.False(t, res.didWork)
	require.Equal(t, "running", res.status.Kind)
	require.Equal(t, "running", h.observe().runStatus.Kind)
	require.Equal(t, start.Add(DefaultCooldown), res.wakeAt, "it wakes when the cooldown ends")
	require.True(t, h.observe().isRunning(id))
}

// 0.4.6 "status cooldown: should transition after the cooldown expires".
func TestRef046_LeavesRunningOnceTheCooldownExpires(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)

	h.runMain()

	o := h.observe()
	require.NotEqual(t, "running", o.runStatus.Kind)
	require.Equal(t, "scheduled", o.runStatus.Kind, "work still runs: scheduled for recovery")
	require.False(t, o.runStatus.Saturated)
	require.True(t, o.isRunning(id))
}

// 0.4.6 "status cooldown: should pick up new work arriving during cooldown
// without a kick" — driven by hand: the loop's next iteration within the
// cooldown starts the new wave with the old one still running.
func TestRef046_PicksUpNewWorkArrivingDuringTheCooldown(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	w1 := h.enqueue()
	h.runMain()
	h.clock.Advance(time.Second)
	res := h.runMain() // nothing new: waiting out the cooldown
	require.Equal(t, "running", res.status.Kind)

	w2 := h.enqueue()
	h.runMain()

	o := h.observe()
	require.ElementsMatch(t, []uuid.UUID{w1, w2}, o.running)
	require.Empty(t, o.pending)
}

// The same with the real loop: a loop waiting out a long cooldown starts
// work enqueued meanwhile at once, not at the cooldown's end.
func TestRef046_WorkEnqueuedDuringTheCooldownStartsBeforeItEnds(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Cooldown: time.Hour, RecoveryPeriod: time.Hour})
	release := make(chan struct{})
	var started atomic.Int32
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	defer close(release)
	_, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return started.Load() == 1 }, testWait, testTick)
	requireRunStatus(t, db, "default", "running")

	_, err = m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return started.Load() == 2 }, 5*time.Second, testTick,
		"the second wave waits for the cooldown's end")
}

// 0.4.6 "status cooldown: bursty throughput: multiple waves processed
// without going idle".
func TestRef046_BurstyWavesWithinTheCooldownNeverLeaveRunning(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(20))
	var statuses []string
	for wave := range 3 {
		if wave > 0 {
			h.clock.Advance(time.Second) // well within the cooldown of the last wave
		}
		for range 3 {
			h.enqueue()
		}
		h.runMain()        // starts the wave
		res := h.runMain() // nothing left: the cooldown decides
		require.Equal(t, res.status.Kind, h.observe().runStatus.Kind)
		statuses = append(statuses, res.status.Kind)
	}
	require.Equal(t, []string{"running", "running", "running"}, statuses)
	require.Len(t, h.observe().running, 9)
	require.Empty(t, h.observe().pending)

	h.clock.Advance(DefaultCooldown + time.Second)
	h.runMain()

	require.NotEqual(t, "running", h.observe().runStatus.Kind)
}

// 001 "should transition to idle state when there is no work" asserts the
// idle status carries the loop's current generation: the status an
// iteration publishes is fenced by (and written at) its own generation.
func TestRef001_IdleIsPublishedAtTheIterationsGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.clock.Advance(DefaultCooldown + time.Second)

	h.runMain()

	o := h.observe()
	require.Equal(t, "idle", o.runStatus.Kind)
	require.Equal(t, h.l.gen, o.generation)
	require.Nil(t, o.runStatus.At)
	require.False(t, o.runStatus.Saturated)
}

// 001 "main: should process pending completions" also asserts the slot is
// freed (running empty) and nothing is counted as failed, retried or
// canceled; the port asserts only completed and succeeded.
func TestRef001_ProcessingACompletionFreesTheSlotAndCountsOnlyASuccess(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)

	h.runMain()

	require.Empty(t, h.observe().running)
	r := h.m.report("default")
	require.Equal(t, int64(1), r.completed)
	require.Equal(t, int64(1), r.succeeded)
	require.Zero(t, r.failed)
	require.Zero(t, r.retries)
	require.Zero(t, r.canceled)
}

// 003 "duplicate pendingCompletion via complete.complete" asserts one
// completion (pcCount 1); the port asserts only attempts and state. Here
// the duplicate records nothing and counts no second retry.
func TestRef003_DuplicateCompleteOfAFailedAttempt_RecordsAndCountsOneRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()
	first := h.complete(id, "failed", 1)
	require.Len(t, first, 1)

	again := h.complete(id, "failed", 2)
	stale := h.complete(id, "failed", 1)

	require.Empty(t, again)
	require.Empty(t, stale)
	require.Equal(t, int64(1), h.m.report("default").retries)
	w := h.work(id)
	require.Equal(t, 1, w.attempts)
	require.Equal(t, "pending", w.state)
	require.Equal(t, []uuid.UUID{id}, h.observe().pending)
}

// 003 "S9 canceled+retrying": the cancelation is consumed as well, and the
// work's hook runs once with the canceled outcome.
func TestRef003_S9CanceledWhileRetrying_ConsumesTheCancelationAndCallsTheHookOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var got []Completion
	h.m.RegisterHook("record", func(_ context.Context, _ pgx.Tx, c Completion) error {
		got = append(got, c)
		return nil
	})
	id := h.s2Running(withRetry(5, 100, 2), withHook("record", `{}`))
	h.complete(id, "failed", 1)
	h.cancel(id)

	h.runMain()
	h.clock.Advance(time.Second)
	h.runMain()

	o := h.observe()
	require.False(t, o.isCanceling(id))
	require.False(t, o.isPending(id))
	require.False(t, o.isRunning(id))
	require.Len(t, got, 1)
	require.Equal(t, OutcomeCanceled, got[0].Outcome)
	require.Equal(t, int64(1), h.m.report("default").canceled)
	require.Equal(t, 1, h.work(id).attempts)
}

// The reference polls main every 200 ms during its cooldown, so a retry
// due within the cooldown starts within 200 ms; here the loop sleeps to the
// cooldown's end but must wake sooner for work due before it
// (TestCooldown_ARetryDueBeforeTheCooldownEndsWakesTheLoopInTime, one org).
// With a second org's work pending, the retry of another org must wake it
// in time as well.
func TestCooldown_ARetryOfAnotherOrgDueBeforeTheCooldownEndsWakesTheLoopInTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.enqueue(withOrg("org-a"), withRunAt(h.clock.Now().Add(time.Hour))) // the first org: only later work
	id := h.enqueue(withOrg("org-b"), withRetry(3, 100, 1))
	h.runMain() // the term's first, full iteration starts org-b's item
	h.complete(id, "failed", 1)
	var runAt time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1`, id).Scan(&runAt))
	require.True(t, runAt.After(h.clock.Now()), "the retry is due later")

	res := h.runMain() // nothing ready, within the cooldown

	require.False(t, res.didWork)
	require.Equal(t, "running", res.status.Kind)
	require.False(t, res.wakeAt.After(runAt), "wakes by %s for org-b's retry, not at the cooldown's end (%s)", runAt, res.wakeAt)
}

// The same for a keyed retry of the only org.
func TestCooldown_AKeyedRetryDueBeforeTheCooldownEndsWakesTheLoopInTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withKey("k", 1), withRetry(3, 100, 1))
	h.runMain()
	h.complete(id, "failed", 1)
	var runAt time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1`, id).Scan(&runAt))

	res := h.runMain()

	require.False(t, res.didWork)
	require.Equal(t, "running", res.status.Kind)
	require.False(t, res.wakeAt.After(runAt), "wakes by %s for the keyed retry, not at the cooldown's end (%s)", runAt, res.wakeAt)
}

// 002 "does not start new work when running.length already exceeds
// maxParallelism", with the waiting work spread over several orgs and keys
// (the fair pick, full and fast), not only one org's plain work.
func TestRef002_DoesNotStartNewWorkOverALoweredMaxParallelism_WhenFairShareStarts(t *testing.T) {
	t.Parallel()
	onBothPaths(t, func(t *testing.T, h *harness) {
		for range 4 {
			h.enqueue(withOrg("org-1"))
		}
		h.runMain()
		require.Len(t, h.observe().running, 4)
		require.NoError(t, h.m.SetMaxParallelism(h.ctx, "default", 2))
		h.enqueue(withOrg("org-a"))
		h.enqueue(withOrg("org-b"))
		h.enqueue(withOrg("org-c"), withKey("k", 1))

		h.runMain()
		o := h.observe()
		require.Len(t, o.running, 4)
		require.Len(t, o.pending, 3)

		h.complete(o.running[0], "success", 1)
		h.runMain()
		o = h.observe()
		require.Len(t, o.running, 3, "3 > 2 still run")
		require.Len(t, o.pending, 3)

		h.complete(o.running[0], "success", 1)
		h.complete(o.running[1], "success", 1)
		h.runMain()
		o = h.observe()
		require.Len(t, o.running, 2, "one slot freed under the new limit is filled, no more")
		require.Len(t, o.pending, 2)
	}, withMaxParallelism(4))
}

// runMainCounted is runMain and how many statements fenced the pool in
// it (each bumps the generation once): 1, the fast statement alone; 2,
// the full iteration after it.
func (h *harness) runMainCounted() (iterResult, int64) {
	h.t.Helper()
	g := h.l.gen
	res := h.runMain()
	return res, h.l.gen - g
}

// A saturated pool of several orgs, within its cooldown: an enqueue's kick
// costs the fast statement alone. Nothing can start before a slot frees,
// and whatever frees one kicks the loop, so no work it cannot see can be
// late; going on to the full iteration here cost every enqueue a second
// transaction.
func TestCooldown_ASaturatedPoolsEnqueueKickCostsOneStatement(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	h.enqueue(withOrg("org-a"))
	h.enqueue(withOrg("org-b"))
	h.enqueue(withOrg("org-a"))
	h.runMain()
	require.Len(t, h.observe().running, 2)
	require.True(t, h.l.shared, "the loop starts fairly in one statement")
	h.clock.Advance(100 * time.Millisecond)
	for range 3 {
		h.enqueue(withOrg("org-c"))
		res, n := h.runMainCounted()
		require.False(t, res.didWork)
		require.True(t, res.wakeAt.After(h.clock.Now()), "it sleeps")
		require.EqualValues(t, 1, n)
	}
}

// Work held back by its key or its org's cap, within the cooldown: the
// loop goes on to the full iteration (it cannot see keyed work's next
// start) and sleeps until the cooldown's end — it does not spin.
func TestCooldown_WorkHeldBackByItsKeyOrCapSleeps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setUp func(h *harness)
	}{
		{"by its key", func(h *harness) {
			h.enqueue(withKey("k", 1))
			h.enqueue(withKey("k", 1))
		}},
		{"by its org's cap", func(h *harness) {
			require.NoError(h.t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", ptr(1)))
			h.enqueue()
			h.enqueue()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			tc.setUp(h)
			h.runMain()
			require.Len(t, h.observe().running, 1)
			for range 3 {
				h.clock.Advance(100 * time.Millisecond)
				res := h.runMain()
				require.False(t, res.didWork)
				require.True(t, res.wakeAt.After(h.clock.Now()), "it sleeps")
			}
		})
	}
}

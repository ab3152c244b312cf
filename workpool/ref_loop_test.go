package workpool

// Ports of the reference loop suites (docs/reference-port.md maps every case):
// TestRef002_* come from 002 (loop.test.ts, 0.4.7), TestRef001_* from the
// cases of 001 (0.2.0) that 002 did not supersede. The reference drives
// `main` by hand with fake timers; so do these, through harness.runMain and
// a fake clock. Where the reference and SPEC differ, SPEC wins.

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

// --- forward progress ---------------------------------------------------------

func TestRef002_StartsAPendingWorkItemWhenMainRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()

	h.runMain()

	o := h.observe()
	require.Empty(t, o.pending)
	require.Equal(t, []uuid.UUID{id}, o.running)
	require.Equal(t, StateRunning, h.status(id).State)
}

func TestRef002_RemovesWorkFromRunningOnceASuccessfulCompletionIsProcessed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()

	h.complete(id, "success", 1)
	h.runMain()

	o := h.observe()
	require.Empty(t, o.running)
	require.Equal(t, StateFinished, h.status(id).State)
}

func TestRef002_TreatsAFinalFailureWithoutRetryPolicyAsTerminal(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()

	h.complete(id, "failed", 1)
	h.runMain()

	require.Empty(t, h.observe().running)
	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeFailed, s.Outcome)
	require.Equal(t, "boom", s.Error)
}

func TestRef002_ProcessesMultipleWorkItemsConcurrentlyWithinCapacity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(5))
	ids := []uuid.UUID{h.enqueue(), h.enqueue(), h.enqueue()}

	h.runMain()

	require.ElementsMatch(t, ids, h.observe().running)
}

// --- capacity -------------------------------------------------------------------

func TestRef002_NeverStartsMoreThanMaxParallelismInOneIteration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(3))
	for range 7 {
		h.enqueue()
	}

	h.runMain()

	o := h.observe()
	require.Len(t, o.running, 3)
	require.Len(t, o.pending, 4)
}

func TestRef002_PicksUpOverflowOnSubsequentIterationsAsSlotsFree(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	for range 4 {
		h.enqueue()
	}
	h.runMain()
	o := h.observe()
	require.Len(t, o.running, 2)
	require.Len(t, o.pending, 2)

	finished := o.running[0]
	h.complete(finished, "success", 1)
	h.runMain()

	o = h.observe()
	require.Len(t, o.running, 2)
	require.Len(t, o.pending, 1)
	require.NotContains(t, o.running, finished)
}

func TestRef002_DoesNotStartNewWorkWhenRunningAlreadyExceedsALoweredMaxParallelism(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	for range 4 {
		h.enqueue()
	}
	h.runMain()
	require.Len(t, h.observe().running, 4)
	require.NoError(t, h.m.SetMaxParallelism(h.ctx, "default", 2))
	late := h.enqueue()

	h.runMain()

	o := h.observe()
	require.Len(t, o.running, 4)
	require.Equal(t, []uuid.UUID{late}, o.pending)

	// Freeing one slot is not enough while 3 > 2 still run.
	h.complete(o.running[0], "success", 1)
	h.runMain()
	require.Equal(t, []uuid.UUID{late}, h.observe().pending)
}

// --- retry -------------------------------------------------------------------------

func TestRef002_ReEnqueuesAFailedJobThatHasARetryPolicyWithAttemptsLeft(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(3, 100, 2))
	h.runMain()

	h.complete(id, "failed", 1)
	h.runMain()

	o := h.observe()
	require.Equal(t, []uuid.UUID{id}, o.pending)
	s := h.status(id)
	require.Equal(t, StatePending, s.State)
	require.Equal(t, 1, s.PreviousAttempts)
}

func TestRef002_DoesNotReEnqueueAFailedJobThatWasCanceledBeforeTheRetryWasProcessed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(3, 100, 2))
	h.runMain()

	h.complete(id, "failed", 1)
	h.cancel(id)
	h.runMain()

	require.Empty(t, h.observe().pending)
	w := h.work(id)
	require.True(t, w.canceled)
	// SPEC: the attempt of canceled work finishes the work as canceled.
	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeCanceled, s.Outcome)
}

// --- cancellation ------------------------------------------------------------------

func TestRef002_RemovesAPendingStartWhenCanceledBeforeTheWorkRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.cancel(id)

	h.runMain()

	o := h.observe()
	require.Empty(t, o.pending)
	require.Empty(t, o.running)
	require.True(t, h.work(id).canceled)
	// SPEC: pending work is removed and finished as canceled.
	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeCanceled, s.Outcome)
	require.Equal(t, 0, s.Attempts)
}

func TestRef002_MarksAnAlreadyRunningWorkAsCanceled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	require.Len(t, h.observe().running, 1)

	h.cancel(id)
	h.runMain()

	require.True(t, h.work(id).canceled)
	require.True(t, h.observe().isRunning(id), "the executor still has to report the attempt")
}

func TestRef002_CancelIsAGracefulNoOpForAlreadyFinishedWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)
	h.runMain()

	h.cancel(id)

	require.Empty(t, h.observe().pendingCancelation)
	require.Equal(t, OutcomeSucceeded, h.status(id).Outcome)
}

// --- lifecycle -----------------------------------------------------------------------

func TestRef002_TransitionsRunningToIdleWhenThereIsNothingToDoPastCooldown(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.clock.Advance(DefaultCooldown + time.Second)

	res := h.runMain()

	require.Equal(t, "idle", h.observe().runStatus.Kind)
	require.True(t, res.wakeAt.IsZero(), "an idle loop sets no timer: only a kick wakes it")
}

func TestRef002_StaysRunningDuringTheCooldownWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)
	h.runMain() // processes the completion: activity just now

	res := h.runMain() // nothing left, but within the cooldown

	require.Equal(t, "running", h.observe().runStatus.Kind)
	require.Equal(t, h.clock.Now().Add(DefaultCooldown), res.wakeAt, "it wakes when the cooldown ends")
}

func TestRef002_TransitionsToScheduledNotSaturatedWhenOnlyFutureWorkRemains(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	future := h.clock.Now().Add(100 * time.Second)
	h.enqueue(withRunAt(future))

	res := h.runMain()

	o := h.observe()
	require.Equal(t, "scheduled", o.runStatus.Kind)
	require.False(t, o.runStatus.Saturated)
	require.NotNil(t, o.runStatus.At)
	require.False(t, o.runStatus.At.After(future))
	require.True(t, future.Equal(res.wakeAt), "it wakes for the future start, not before: %v", res.wakeAt)
	require.Empty(t, o.running)
}

// The reference re-reads with a read dependency before going idle; here the
// loop listens before it looks (TestKickStartsWorkEnqueuedWhileTheLoopIsIdle)
// and an iteration never goes idle past work it can see.
func TestRef002_DoesNotLoseWorkWhenReCheckingBeforeGoingIdle(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()

	h.runMain()

	require.Equal(t, []uuid.UUID{id}, h.observe().running)
	require.NotEqual(t, "idle", h.observe().runStatus.Kind)
}

// --- saturated -------------------------------------------------------------------------

// fillRunningTo starts n items so that n slots are taken.
func (h *harness) fillRunningTo(n int) []uuid.UUID {
	h.t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = h.enqueue()
	}
	h.runMain()
	require.Len(h.t, h.observe().running, n)
	h.clock.Advance(DefaultCooldown + time.Second)
	return ids
}

func TestRef002_RecordsSaturatedTrueWhenSchedulingAtFullCapacity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(3))
	h.fillRunningTo(3)

	h.runMain()

	o := h.observe()
	require.Equal(t, "scheduled", o.runStatus.Kind)
	require.True(t, o.runStatus.Saturated)
}

func TestRef002_RecordsSaturatedFalseWhenSchedulingUnderCapacity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(5))
	h.fillRunningTo(2)

	h.runMain()

	o := h.observe()
	require.Equal(t, "scheduled", o.runStatus.Kind)
	require.False(t, o.runStatus.Saturated)
}

func TestRef002_ClearsSaturatedWhenACompletionFreesASlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	ids := h.fillRunningTo(2)
	h.runMain()
	require.True(t, h.observe().runStatus.Saturated)
	require.True(t, h.l.startsBlocked.Load(), "a saturated loop ignores enqueue kicks")

	h.complete(ids[0], "success", 1)
	h.runMain()

	o := h.observe()
	require.NotEqual(t, "idle", o.runStatus.Kind)
	require.False(t, o.runStatus.Saturated)
	require.False(t, h.l.startsBlocked.Load())
}

func TestRef002_DoesNotStartNewWorkWhileSaturatedEvenWhenPendingAccumulates(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	h.fillRunningTo(2)
	late := h.enqueue()

	h.runMain()

	o := h.observe()
	require.Len(t, o.running, 2)
	require.Contains(t, o.pending, late)
	require.Equal(t, "scheduled", o.runStatus.Kind)
	require.True(t, o.runStatus.Saturated)
}

func TestRef002_StaysSaturatedWhenACompletionFreesASlotButMoreWorkIsWaiting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	ids := h.fillRunningTo(2)
	h.enqueue()
	h.enqueue()
	h.runMain()
	require.Equal(t, RunStatus{Kind: "scheduled", Saturated: true}, withoutAt(h.observe().runStatus))

	h.complete(ids[0], "success", 1)
	h.runMain() // processes the completion and refills the slot
	h.clock.Advance(DefaultCooldown + time.Second)
	h.runMain()

	o := h.observe()
	require.Len(t, o.running, 2)
	require.Equal(t, RunStatus{Kind: "scheduled", Saturated: true}, withoutAt(o.runStatus))
}

func withoutAt(s RunStatus) RunStatus { s.At = nil; return s }

// --- recovery ----------------------------------------------------------------------------

func TestRef002_FlagsRunningEntriesWhoseWorkerHasBeenSilentPastTheThreshold(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.claimAll()
	h.clock.Advance(DefaultHeartbeatTimeout + time.Second)

	h.runMain() // recovery: the silent attempt counts as failed

	require.False(t, h.observe().isRunning(id), "recording the failure freed the slot")
	s := h.status(id)
	require.Equal(t, StateFinished, s.State)
	require.Equal(t, OutcomeFailed, s.Outcome)
	require.Contains(t, s.Error, "stopped heartbeating")

	h.runMain()
	require.False(t, h.observe().isRunning(id))
}

// claimAll claims started work as an executor would (without running it).
func (h *harness) claimAll() []claimedJob {
	h.t.Helper()
	h.m.Register("test_handle", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	jobs, err := h.m.exec.claim([]string{"test_handle"}, 1000)
	require.NoError(h.t, err)
	return jobs
}

// --- generation safety -------------------------------------------------------------------

func TestRef002_RejectsMainCallsWithTheWrongGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.l.gen = 99

	_, err := h.l.iterate(h.ctx)

	require.ErrorIs(t, err, errGenerationMismatch)
	require.ErrorContains(t, err, "generation mismatch")
	require.Equal(t, []uuid.UUID{id}, h.observe().pending, "a stale iteration writes nothing")
}

func TestRef002_IncrementsTheGenerationEachTimeMainRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	before := h.observe().generation

	h.runMain()

	require.Greater(t, h.observe().generation, before)
	require.Equal(t, h.observe().generation, h.l.gen)
}

// --- snapshot semantics --------------------------------------------------------------------

func TestRef002_ProcessesWorkThatWasCommittedBeforeMainStarted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()

	h.runMain()

	require.Equal(t, []uuid.UUID{id}, h.observe().running)
}

// Work enqueued in a transaction that is still open when the loop looks is
// invisible to it; its commit must wake the loop (listen before look).
func TestRef002_WorkCommittedAfterTheLoopLookedIsStartedByItsNotification(t *testing.T) {
	t.Parallel()
	// No timer could start the work: recovery is an hour away and an idle
	// loop sets none.
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, RecoveryPeriod: time.Hour})
	tx, err := db.Begin(context.Background())
	require.NoError(t, err)
	id, err := m.EnqueueTx(context.Background(), tx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireLoopSettled(t, db, m, "default", "idle") // it looked, and saw nothing
	before := m.loopFor("default").iterations.Load()

	require.NoError(t, tx.Commit(context.Background()))

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Greater(t, m.loopFor("default").iterations.Load(), before, "the commit's notification woke the loop")
}

// --- 001 cases that 002 did not supersede ----------------------------------------------------

func TestRef001_PendingStartPlusCancelationFinishesCanceledAndCountsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.cancel(id)

	h.runMain()

	o := h.observe()
	require.Empty(t, o.pending)
	require.Empty(t, o.pendingCancelation)
	require.Empty(t, o.running)
	require.Equal(t, int64(1), h.m.report("default").canceled)
	require.True(t, h.work(id).canceled)
}

func TestRef001_ProcessingACompletionCountsItInTheReport(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)

	h.runMain()
	require.Equal(t, int64(1), h.m.report("default").completed)
	require.Equal(t, int64(1), h.m.report("default").succeeded)
}

func TestRef001_HandlingAJobRetryCountsItAndBumpsAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(3, 1000, 2))
	h.runMain()
	h.complete(id, "failed", 1)
	h.runMain()
	h.clock.Advance(2 * time.Second) // past the first backoff (≤ 1.5 s)
	h.runMain()
	h.complete(id, "failed", 2)

	h.runMain()
	require.Equal(t, 2, h.work(id).attempts)
	require.Equal(t, []uuid.UUID{id}, h.observe().pending)
	require.Equal(t, int64(2), h.m.report("default").retries)
}

func TestRef001_ProcessingPendingCancelationsLeavesOtherRunningWorkAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	other := h.enqueue()
	h.runMain()
	id := h.enqueue(withRetry(3, 1000, 2))
	h.cancel(id)

	h.runMain()

	o := h.observe()
	require.Empty(t, o.pendingCancelation)
	require.Empty(t, o.pending)
	require.True(t, h.work(id).canceled)
	require.Equal(t, int64(1), h.m.report("default").canceled)
	require.Equal(t, []uuid.UUID{other}, o.running)
	require.False(t, h.work(other).canceled)
}

func TestRef001_OutstandingCancelationsKeepTheLoopFromGoingIdle(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)
	h.cancel(id)

	res := h.runMain()

	require.True(t, res.didWork)
	require.NotEqual(t, "idle", h.observe().runStatus.Kind)
}

func TestRef001_RunningGoesIdleWhenAllWorkIsDone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue()
	h.runMain()
	h.complete(id, "success", 1)
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)

	h.runMain()

	require.Equal(t, "idle", h.observe().runStatus.Kind)
}

func TestRef001_CompleteRunsTheOnCompleteHookAndFinishesTheWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var got []Completion
	h.m.RegisterHook("record", func(_ context.Context, _ pgx.Tx, c Completion) error {
		got = append(got, c)
		return nil
	})
	id := h.enqueue(withHook("record", `{"data":"test"}`))
	h.runMain()

	h.complete(id, "success", 1)

	require.Len(t, got, 1)
	require.Equal(t, id, got[0].WorkID)
	require.Equal(t, OutcomeSucceeded, got[0].Outcome)
	require.JSONEq(t, `{"data":"test"}`, string(got[0].Context))
	require.Equal(t, StateFinished, h.status(id).State)
}

func TestRef001_EnqueueWakesAnIdleLoopToRunning(t *testing.T) {
	t.Parallel()
	// A long cooldown keeps "running" visible while the work runs.
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Cooldown: time.Minute, RecoveryPeriod: time.Hour})
	requireLoopSettled(t, db, m, "default", "idle")
	release := make(chan struct{})
	var started atomic.Bool
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		started.Store(true)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})

	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)

	requireRunStatus(t, db, "default", "running")
	require.Eventually(t, started.Load, testWait, testTick)
	close(release)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
}

func TestRef001_EnqueueWakesAScheduledLoopToRunning(t *testing.T) {
	t.Parallel()
	// A long cooldown keeps "running" visible once the work ran.
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Cooldown: time.Minute})
	_, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	requireLoopSettled(t, db, m, "default", "scheduled")

	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)

	requireRunStatus(t, db, "default", "running")
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
}

// A cancelation committed after an iteration took its batch, but before it
// decided its status, keeps the loop "running" and looping: it is work the
// next iteration must do, not a reason to go idle.
func TestOutlook_ACancelationArrivingMidIterationKeepsTheLoopRunning(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRunAt(h.clock.Now().Add(time.Hour)))
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)

	tx, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(h.ctx) }()
	it := &iteration{l: h.l, tx: tx, now: h.clock.Now(), gen: h.l.gen + 1}
	cancels, err := it.open(h.ctx)
	require.NoError(t, err)
	require.Empty(t, cancels)
	h.cancel(id) // commits while the iteration is open

	res, err := it.outlook(h.ctx)

	require.NoError(t, err)
	require.True(t, res.didWork, "the loop iterates again at once")
	require.Equal(t, "running", res.status.Kind)
}

// A loop waiting out its cooldown wakes for work due before the cooldown
// ends — a retry the completer scheduled a few milliseconds out — rather
// than at the cooldown's end.
func TestCooldown_ARetryDueBeforeTheCooldownEndsWakesTheLoopInTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.enqueue(withRetry(3, 100, 1))
	h.runMain() // the term's first, full iteration starts it
	h.complete(id, "failed", 1)
	var runAt time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1`, id).Scan(&runAt))
	require.True(t, runAt.After(h.clock.Now()), "the retry is due later")

	res := h.runMain() // the fast path: nothing ready, within the cooldown

	require.False(t, res.didWork)
	require.Equal(t, "running", res.status.Kind)
	require.False(t, res.wakeAt.After(runAt), "wakes by %s for the retry, not at the cooldown's end (%s)", runAt, res.wakeAt)
}

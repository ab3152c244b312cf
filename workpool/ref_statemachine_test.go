package workpool

// Ports of reference suite 003 (stateMachine.test.ts): the composite states
// S1…S12 of a work item and their transitions under main, complete and
// cancel. The reference's tables map to this schema as:
//
//	work (present)        work row not finished       work (absent) → finished row
//	pendingStart          state pending               running (a slot) → state running
//	pendingCancelation    workpool_cancelations row
//
// The reference's pendingCompletion has no counterpart (issue 12 wins over
// SPEC §3 here): recording an attempt frees its slot and decides the next
// state — finished, or pending again at its retry time — in one statement,
// so the cases about a completion "waiting for main" assert that end state
// directly after complete.
//
// The cases marked BUG in the reference assert the fixed behaviour here.

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Named states, built through the public paths where they exist.

func (h *harness) s1Enqueued() uuid.UUID { return h.enqueue() }

func (h *harness) s2Running(opts ...workOpt) uuid.UUID {
	id := h.enqueue(opts...)
	h.runMain()
	require.Equal(h.t, "running", h.work(id).state)
	return id
}

func (h *harness) s2RunningWithRetries() uuid.UUID { return h.s2Running(withRetry(5, 100, 2)) }

func (h *harness) s3Completing(kind string) uuid.UUID {
	id := h.s2Running()
	h.complete(id, kind, 1)
	return id
}

func (h *harness) s5CompletingWillRetry() uuid.UUID {
	id := h.s2RunningWithRetries()
	h.complete(id, "failed", 1)
	w := h.work(id)
	require.Equal(h.t, "pending", w.state)
	require.Equal(h.t, 1, w.attempts)
	return id
}

func (h *harness) s7CancelPending() uuid.UUID {
	id := h.s1Enqueued()
	h.cancel(id)
	return id
}

func (h *harness) s8CancelRunning() uuid.UUID {
	id := h.s2Running()
	h.cancel(id)
	return id
}

func (h *harness) s9CanceledRetrying() uuid.UUID {
	id := h.s5CompletingWillRetry()
	h.cancel(id)
	return id
}

func (h *harness) s10ReEnqueued() uuid.UUID {
	id := h.s5CompletingWillRetry()
	h.runMain()
	require.Equal(h.t, "pending", h.work(id).state)
	require.Equal(h.t, 1, h.work(id).attempts)
	return id
}

func (h *harness) s12CanceledAwaitingComplete() uuid.UUID {
	id := h.s8CancelRunning()
	h.runMain()
	require.True(h.t, h.work(id).canceled)
	return id
}

// --- main loop transitions -------------------------------------------------------

func TestRef003_S1EnqueuedToS2Running_StartsWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s1Enqueued()

	h.runMain()

	o := h.observe()
	require.False(t, o.isPending(id))
	require.True(t, o.isRunning(id))
	require.False(t, o.isCanceling(id))
}

func TestRef003_S10ReEnqueuedToS2Running_StartsRetryWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s10ReEnqueued()
	h.clock.Advance(time.Second) // past the jittered 100 ms backoff

	h.runMain()

	o := h.observe()
	require.False(t, o.isPending(id))
	require.True(t, o.isRunning(id))
	require.Equal(t, 1, h.work(id).attempts)
}

func TestRef003_S3CompletingSuccessToFinished_FreesTheSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s3Completing("success")

	h.runMain()

	o := h.observe()
	require.Equal(t, "finished", h.work(id).state)
	require.False(t, o.isPending(id))
	require.False(t, o.isRunning(id))
	require.False(t, o.isCanceling(id))
}

func TestRef003_S3CompletingFinalFailureToFinished_FreesTheSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s3Completing("failed")

	h.runMain()

	o := h.observe()
	require.Equal(t, "finished", h.work(id).state)
	require.False(t, o.isRunning(id))
}

func TestRef003_S5CompletingWillRetry_IsRescheduled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s5CompletingWillRetry()

	h.runMain()

	o := h.observe()
	require.NotEqual(t, "finished", h.work(id).state)
	require.True(t, o.isPending(id) || o.isRunning(id), "the retry is either waiting for its backoff or already started")
}

func TestRef003_S7CancelPendingToCanceled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s7CancelPending()

	h.runMain()

	o := h.observe()
	require.False(t, o.isPending(id))
	require.False(t, o.isCanceling(id))
	require.False(t, o.isRunning(id))
	w := h.work(id)
	require.True(t, w.canceled)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "canceled", *w.outcome)
}

func TestRef003_S8CancelRunningToS12CanceledStillRunning(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s8CancelRunning()

	h.runMain()

	o := h.observe()
	require.False(t, o.isCanceling(id))
	require.True(t, o.isRunning(id))
	require.True(t, h.work(id).canceled)
}

func TestRef003_S9CanceledWhileRetrying_DoesNotRetryButFinishesCanceled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s9CanceledRetrying()

	h.runMain()

	o := h.observe()
	require.False(t, o.isRunning(id))
	require.False(t, o.isPending(id))
	require.Equal(t, "canceled", *h.work(id).outcome)
}

func TestRef003_S2RunningWithNoPendingEvents_IsUnchanged(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()

	h.runMain()

	require.True(t, h.observe().isRunning(id))
	require.Equal(t, 0, h.work(id).attempts)
}

func TestRef003_S12CanceledAwaitingComplete_IsUnchanged(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s12CanceledAwaitingComplete()

	h.runMain()

	require.True(t, h.observe().isRunning(id))
	require.True(t, h.work(id).canceled)
}

// --- complete transitions -----------------------------------------------------------

func TestRef003_S2RunningCompleteSuccess_FinishesWithACompletionWithoutRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()

	h.complete(id, "success", 1)

	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "succeeded", *w.outcome)
	require.False(t, h.observe().isRunning(id), "recording the attempt freed its slot")
}

func TestRef003_S2RunningWithRetriesCompleteFailed_KeepsTheWorkWithARetryCompletion(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()

	h.complete(id, "failed", 1)

	w := h.work(id)
	require.Equal(t, "pending", w.state, "scheduled for its retry")
	require.Equal(t, 1, w.attempts)
	require.Nil(t, w.outcome)
	o := h.observe()
	require.False(t, o.isRunning(id), "recording the attempt freed its slot")
	require.True(t, o.isPending(id))
}

func TestRef003_S2RunningWithoutRetriesCompleteFailed_FinishesWithAFailedCompletion(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()

	h.complete(id, "failed", 1)

	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "failed", *w.outcome)
	require.False(t, h.observe().isRunning(id), "recording the attempt freed its slot")
}

// The reference deletes canceled work without a pending completion; here
// every finished attempt frees its slot when it is recorded and leaves a
// finished record.
func TestRef003_S2RunningCompleteCanceled_FinishesCanceledAndFreesTheSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s12CanceledAwaitingComplete()

	h.complete(id, "failed", 1) // the handler returned after its context was canceled

	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "canceled", *w.outcome)
	require.False(t, h.observe().isRunning(id))
	h.runMain()
	require.False(t, h.observe().isRunning(id))
}

// SPEC: whatever the handler of canceled work returns, it finishes canceled.
func TestRef003_S12CanceledRunningCompleteSuccess_FinishesCanceled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s12CanceledAwaitingComplete()

	h.complete(id, "success", 1)

	w := h.work(id)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "canceled", *w.outcome)
	require.False(t, h.observe().isRunning(id))
}

func TestRef003_CompleteWithWrongAttemptNumber_IsANoOp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()

	done := h.complete(id, "success", 999)

	require.Empty(t, done)
	w := h.work(id)
	require.Equal(t, "running", w.state)
	require.Equal(t, 0, w.attempts)
}

func TestRef003_CompleteOnAbsentWork_IsANoOp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	absent := newID()

	done := h.complete(absent, "success", 1)

	require.Empty(t, done)
}

func TestRef003_DuplicateCompleteWithTheOldAttempt_IsANoOp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()
	h.complete(id, "failed", 1)
	require.Equal(t, 1, h.work(id).attempts)

	h.complete(id, "failed", 1)

	w := h.work(id)
	require.Equal(t, 1, w.attempts)
	require.Equal(t, "pending", w.state)
}

// BUG in the reference: attempts incremented before the dedup check.
func TestRef003_DuplicateCompleteWithTheNextAttempt_LeavesAttemptsAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()
	h.complete(id, "failed", 1)
	require.Equal(t, 1, h.work(id).attempts)

	done := h.complete(id, "failed", 2)

	require.Empty(t, done)
	require.Equal(t, 1, h.work(id).attempts, "fixed: a complete for an attempt that never started changes nothing")
}

// --- cancel transitions -------------------------------------------------------------

func TestRef003_S1EnqueuedCancel_AddsAPendingCancelation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s1Enqueued()

	h.cancel(id)

	o := h.observe()
	require.True(t, o.isPending(id))
	require.True(t, o.isCanceling(id))
}

func TestRef003_S2RunningCancel_AddsAPendingCancelation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()

	h.cancel(id)

	o := h.observe()
	require.True(t, o.isRunning(id))
	require.True(t, o.isCanceling(id))
}

func TestRef003_S10ReEnqueuedCancel_AddsAPendingCancelation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s10ReEnqueued()

	h.cancel(id)

	o := h.observe()
	require.True(t, o.isPending(id))
	require.True(t, o.isCanceling(id))
}

func TestRef003_AbsentWorkCancel_IsANoOp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)

	h.cancel(newID())

	require.Empty(t, h.observe().pendingCancelation)
}

func TestRef003_S7AlreadyCancelPendingCancel_KeepsOneCancelation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s7CancelPending()

	h.cancel(id)
	n, err := h.m.CancelAll(h.ctx, "org-1", "default", h.clock.Now().Add(time.Hour))

	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, []uuid.UUID{id}, h.observe().pendingCancelation)
}

// --- recovery transitions -----------------------------------------------------------

func (h *harness) pastRecovery() { h.clock.Advance(DefaultHeartbeatTimeout + time.Second) }

// The reference's "work absent + running + pendingCompletion": finished work
// whose completion waits is freed by the completion, and recovery leaves it
// alone.
func TestRef003_FinishedWorkWithAPendingCompletionPastRecovery_IsFreedNotRecovered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s3Completing("success")
	h.pastRecovery()

	h.runMain()

	o := h.observe()
	require.False(t, o.isRunning(id))
	require.Equal(t, "succeeded", *h.work(id).outcome)
}

// The reference asks the scheduler whether the worker still runs; here the
// heartbeat says so: an old attempt with a fresh heartbeat is left alone.
func TestRef003_OldRunningWorkWithAFreshHeartbeat_IsNotRecovered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()
	h.claimAll()
	h.pastRecovery()
	h.exec(`UPDATE workpool_work SET heartbeat_at = $2 WHERE id = $1`, id, h.clock.Now())

	h.runMain()

	require.True(t, h.observe().isRunning(id))
	require.Equal(t, "running", h.work(id).state)
	require.Equal(t, 0, h.work(id).attempts)
}

func TestRef003_OldRunningWorkWithAStaleHeartbeat_IsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()
	h.claimAll()
	h.pastRecovery()

	h.runMain() // the silent attempt fails and is scheduled for its retry

	w := h.work(id)
	require.Equal(t, "pending", w.state)
	require.Equal(t, 1, w.attempts)
}

// A term does not count the silence from before it: an outage that ended
// the last term (Postgres restarted) kept the executors from heartbeating
// as well. A new term recovers an attempt only once its executor has had a
// heartbeat timeout within the term to heartbeat — an executor that does
// keeps its attempt; one that stays silent loses it.
func TestRecovery_ANewTermLeavesAttemptsSilentSinceBeforeItAHeartbeatTimeoutToHeartbeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		heartbeats bool
	}{{"an executor that heartbeats keeps its attempt", true}, {"a silent one loses it", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			id := h.s2RunningWithRetries()
			h.claimAll()
			h.pastRecovery()                        // silent for longer than the timeout …
			require.NoError(t, h.l.takeover(h.ctx)) // … when a new term began

			h.runMain()
			require.Equal(t, "running", h.work(id).state, "not recovered at the term's start")
			h.clock.Advance(DefaultHeartbeatTimeout / 2)
			h.runMain()
			require.Equal(t, "running", h.work(id).state, "nor within its first heartbeat timeout")

			if tc.heartbeats {
				h.exec(`UPDATE workpool_work SET heartbeat_at = $2 WHERE id = $1`, id, h.clock.Now())
			}
			h.clock.Advance(DefaultHeartbeatTimeout/2 + DefaultRecoveryPeriod)
			h.runMain()
			w := h.work(id)
			if tc.heartbeats {
				require.Equal(t, "running", w.state)
				require.Equal(t, 0, w.attempts)
				return
			}
			require.Equal(t, "pending", w.state, "recovered and scheduled for its retry")
			require.Equal(t, 1, w.attempts)
		})
	}
}

func TestRef003_S12CanceledRunningPastRecovery_FinishesCanceledWithoutRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls int
	h.m.RegisterHook("count", func(context.Context, pgx.Tx, Completion) error { calls++; return nil })
	id := h.s2Running(withRetry(5, 100, 2), withHook("count", `{}`))
	h.claimAll()
	h.cancel(id)
	h.runMain()
	h.pastRecovery()

	h.runMain()

	w := h.work(id)
	require.True(t, w.canceled)
	require.Equal(t, "finished", w.state)
	require.Equal(t, "canceled", *w.outcome)
	require.Equal(t, 1, calls)
}

// --- invalid states -------------------------------------------------------------------

// BUG in the reference: a pendingStart left behind for running work. Here a
// start and a run are one state column, so the orphan cannot exist; the
// nearest hazard — a stale retryable failure of an earlier attempt arriving
// while the retry runs — must not make the running work pending again.
func TestRef003_StaleRetryCompletionForRunningWork_LeavesNoPendingStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s10ReEnqueued()
	h.clock.Advance(time.Second)
	h.runMain()
	require.Equal(t, "running", h.work(id).state)

	h.complete(id, "failed", 1) // attempt 1's result, again
	h.runMain()

	o := h.observe()
	require.True(t, o.isRunning(id))
	require.False(t, o.isPending(id))
	require.Equal(t, "running", h.work(id).state)
}

// BUG in the reference: a duplicate complete bumped attempts again.
func TestRef003_DuplicateCompleteOfAFailedAttempt_LeavesAttemptsAndOneCompletion(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2RunningWithRetries()
	h.complete(id, "failed", 1)

	h.complete(id, "failed", 2)

	w := h.work(id)
	require.Equal(t, 1, w.attempts)
	require.Equal(t, "pending", w.state)
}

// --- multi-step / interleaved transitions ---------------------------------------------

func TestRef003_CompletionAndNewEnqueue_AreProcessedInOnePass(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	w1 := h.s2Running()
	h.complete(w1, "success", 1)
	w2 := h.enqueue()

	h.runMain()

	o := h.observe()
	require.Equal(t, "finished", h.work(w1).state)
	require.False(t, o.isRunning(w1))
	require.True(t, o.isRunning(w2))
}

func TestRef003_TwoJobsCompleteWithRetryBeforeMain_MainRetriesBoth(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	w1 := h.enqueue(withRetry(5, 100, 2))
	w2 := h.enqueue(withRetry(5, 100, 2))
	h.runMain()
	h.complete(w1, "failed", 1)
	h.complete(w2, "failed", 1)
	require.Equal(t, "pending", h.work(w1).state)
	require.Equal(t, "pending", h.work(w2).state)

	h.runMain()
	h.clock.Advance(time.Second)
	h.runMain()

	o := h.observe()
	for _, id := range []uuid.UUID{w1, w2} {
		require.True(t, o.isRunning(id))
		require.False(t, o.isPending(id))
		require.Equal(t, 1, h.work(id).attempts)
	}
}

func TestRef003_CancelArrivingWhileARetryCompletionIsPending_Wins(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s5CompletingWillRetry()
	h.cancel(id)

	h.runMain()

	o := h.observe()
	require.False(t, o.isPending(id))
	require.False(t, o.isRunning(id))
	require.Equal(t, "canceled", *h.work(id).outcome)
}

// BUG in the reference: duplicate cancelations crashed main. Here there is
// at most one pending cancelation per work, and processing a cancelation of
// already-canceled work is a no-op that counts nothing twice.
func TestRef003_DuplicateCancelationsOfOneWork_NeitherCrashNorDoubleCount(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls int
	h.m.RegisterHook("count", func(context.Context, pgx.Tx, Completion) error { calls++; return nil })
	id := h.enqueue(withHook("count", `{}`))
	h.cancel(id)
	h.cancel(id)
	require.Len(t, h.observe().pendingCancelation, 1)

	h.runMain()
	h.exec(`INSERT INTO workpool_cancelations (work_id, pool, org_id) VALUES ($1, 'default', 'org-1')`, id)
	h.runMain()

	require.Equal(t, int64(1), h.m.report("default").canceled)
	require.Equal(t, 1, calls)
	require.Empty(t, h.observe().pendingCancelation)
	require.Equal(t, "canceled", *h.work(id).outcome)
}

func TestRef003_CompleteSuccessThenCancel_CancelIsANoOp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()
	h.complete(id, "success", 1)

	h.cancel(id)
	h.runMain()

	require.False(t, h.observe().isRunning(id))
	w := h.work(id)
	require.Equal(t, "succeeded", *w.outcome)
	require.False(t, w.canceled)
}

func TestRef003_RetryWithALargeBackoff_IsNotStartedInTheSamePass(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running(withRetry(5, 60_000, 2))
	h.complete(id, "failed", 1)

	h.runMain()

	o := h.observe()
	require.False(t, o.isRunning(id))
	require.True(t, o.isPending(id))
}

func TestRef003_AfterAMainCrash_ANewLoopRecoversTheState(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s2Running()
	h.complete(id, "success", 1)

	h.l = newLoop(h.m, "default") // the old loop is gone; a new term takes over
	require.NoError(t, h.l.takeover(h.ctx))
	h.runMain()

	require.Equal(t, "finished", h.work(id).state)
	require.False(t, h.observe().isRunning(id))
}

func TestRef003_AllThreeQueuesPopulated_MainProcessesThemInOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	w1 := h.s2Running()
	h.complete(w1, "success", 1)
	w2 := h.enqueue()
	h.cancel(w2)
	w3 := h.enqueue()

	h.runMain()

	o := h.observe()
	require.False(t, o.isRunning(w1))
	require.False(t, o.isPending(w2))
	require.False(t, o.isCanceling(w2))
	require.True(t, h.work(w2).canceled)
	require.True(t, o.isRunning(w3))
	require.False(t, o.isPending(w3))
}

func TestRef003_CancelDuringS5WithTheCancelationStillPending_DoesNotRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.s5CompletingWillRetry()
	h.cancel(id)
	require.True(t, h.observe().isCanceling(id))

	h.runMain()

	o := h.observe()
	require.False(t, o.isPending(id))
	require.False(t, o.isRunning(id))
	require.False(t, o.isCanceling(id))
}

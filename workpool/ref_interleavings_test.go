package workpool

// Interleavings of the reference suites (docs/reference-port.md) that the
// other ports reach only in another order: each case's reference is named
// in its comment.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// 003 "complete(success) + cancel", the other way round: a cancel requested
// for running work, then the attempt succeeds before the
// loop processed the cancelation: the reference's complete ignores a cancel
// main has not processed; the work finishes succeeded, the late
// cancelation is consumed as a no-op.
func TestRef_ACancelOfRunningWorkThatSucceedsBeforeTheLoopSeesItFinishesSucceeded(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		var got []Completion
		h.m.RegisterHook("rec", func(_ context.Context, _ pgx.Tx, c Completion) error { got = append(got, c); return nil })
		id := h.s2Running(withHook("rec", `{}`))
		h.cancel(id)
		h.complete(id, "success", 1)

		h.runMain()

		w := h.work(id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "succeeded", *w.outcome)
		require.Empty(t, h.observe().pendingCancelation)
		require.Len(t, got, 1)
		require.Equal(t, OutcomeSucceeded, got[0].Outcome)
		require.Equal(t, int64(0), h.m.report("default").canceled)
	})
}

// 003 S9 ("cancel wins"), the cancel requested first: a cancel of running
// work with retries left, whose attempt then fails
// retryably before main: cancel wins; hook once with canceled.
func TestRef_ACancelOfRunningWorkThatFailsRetryablyBeforeTheLoopSeesItWins(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		var got []Completion
		h.m.RegisterHook("rec", func(_ context.Context, _ pgx.Tx, c Completion) error { got = append(got, c); return nil })
		id := h.s2Running(withRetry(5, 100, 2), withHook("rec", `{}`))
		h.cancel(id)
		h.complete(id, "failed", 1)
		h.clock.Advance(time.Second) // the retry is due

		h.runMain()
		h.runMain()

		o := h.observe()
		require.False(t, o.isRunning(id))
		require.False(t, o.isPending(id))
		require.Empty(t, o.pendingCancelation)
		w := h.work(id)
		require.Equal(t, "finished", w.state)
		require.Equal(t, "canceled", *w.outcome)
		require.Len(t, got, 1)
		require.Equal(t, OutcomeCanceled, got[0].Outcome)
		require.Equal(t, int64(1), h.m.report("default").canceled)
	})
}

// 002 retry: status of a running retry reports previous attempts.
func TestRef_TheStatusOfARunningRetryCountsItsPreviousAttempts(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		id := h.s2Running(withRetry(5, 100, 2))
		h.complete(id, "failed", 1)
		h.clock.Advance(time.Second)
		h.runMain()
		s := h.status(id)
		require.Equal(t, StateRunning, s.State)
		require.Equal(t, 1, s.PreviousAttempts)
		h.complete(id, "success", 2)
		s = h.status(id)
		require.Equal(t, StateFinished, s.State)
		require.Equal(t, 2, s.Attempts)
	})
}

// 001 retries report: a retry then a success counts one retry, one
// completed, one succeeded, nothing failed.
func TestRef_ARetryThenASuccessIsReportedAsOneRetryAndOneSuccess(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		id := h.s2Running(withRetry(5, 100, 2))
		h.complete(id, "failed", 1)
		h.clock.Advance(time.Second)
		h.runMain()
		h.complete(id, "success", 2)
		h.runMain()
		r := h.m.report("default")
		require.Equal(t, int64(1), r.retries)
		require.Equal(t, int64(1), r.completed)
		require.Equal(t, int64(1), r.succeeded)
		require.Equal(t, int64(0), r.failed)
		require.Equal(t, int64(0), r.canceled)
	})
}

// 002 "never starts more than maxParallelism" with a retry pending beside
// new work: the retry counts against the limit once started.
func TestRef_ARetryAndNewWorkShareThePoolsLimit(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		a := h.s2Running(withRetry(5, 100, 2))
		h.complete(a, "failed", 1)
		for range 3 {
			h.enqueue()
		}
		h.clock.Advance(time.Second)
		h.runMain()
		h.runMain()
		require.Len(t, h.observe().running, 2)
	}, withMaxParallelism(2))
}

// 003 "complete with wrong attempt number -> no-op" for canceled running
// work: a mismatched attempt does not finish it.
func TestRef_AWrongAttemptOnCanceledRunningWorkIsANoOp(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		id := h.s12CanceledAwaitingComplete()
		done := h.complete(id, "success", 2)
		require.Empty(t, done)
		require.Equal(t, "running", h.work(id).state)
		require.True(t, h.observe().isRunning(id))
	})
}

// 002 cancellation of future-scheduled (not yet due) work finishes it
// canceled at once, not at its run_at.
func TestRef_ACancelOfWorkNotYetDueFinishesItAtOnce(t *testing.T) {
	onBothPaths(t, func(t *testing.T, h *harness) {
		id := h.enqueue(withRunAt(h.clock.Now().Add(time.Hour)))
		h.runMain()
		h.clock.Advance(DefaultCooldown + time.Second)
		h.runMain()
		h.cancel(id)
		h.runMain()
		s := h.status(id)
		require.Equal(t, StateFinished, s.State)
		require.Equal(t, OutcomeCanceled, s.Outcome)
	})
}

package wakeup

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/queue"
)

const (
	testWait = 10 * time.Second
	testTick = 10 * time.Millisecond
)

// recordingSignaler stands in for Temporal, which these tests run without:
// it accepts every signal and counts them by workflow id.
type recordingSignaler struct {
	mu    sync.Mutex
	calls map[string]int
}

func newRecordingSignaler() *recordingSignaler { return &recordingSignaler{calls: map[string]int{}} }

func (r *recordingSignaler) SignalWorkflow(_ context.Context, workflowID, _, _ string, _ any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[workflowID]++
	return nil
}

func (r *recordingSignaler) count(workflowID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[workflowID]
}

// requireSignalSent waits until the wake-up's signal is delivered and
// returns its message.
func (f *fixture) requireSignalSent(t *testing.T, id string) queue.Message {
	t.Helper()
	var m queue.Message
	require.Eventually(t, func() bool {
		var err error
		m, err = queue.GetByKey(context.Background(), f.db, "o", Queue, id)
		return err == nil && m.Status == queue.StatusDelivered
	}, testWait, testTick)
	return m
}

// The work completes on this replica; its hook's signal is handed to this
// replica's dispatcher after the commit: no notification, no claim (the
// handoff lease outlasts the test, so no claim could have taken it).
func TestWorkCompletedHereWakesItsWorkflowThroughTheLocalDispatcher(t *testing.T) {
	sig := newRecordingSignaler()
	f := newFixtureWith(t, fixtureOptions{signals: sig, handoffLease: time.Hour})
	ctx := context.Background()
	conn, err := f.db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN reveille_queue") // the dispatchers' channel
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "UNLISTEN reveille_queue") }()

	w, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)

	m := f.requireSignalSent(t, w.ID.String())
	require.Equal(t, 1, sig.count("o/wf"))
	require.Equal(t, 1, m.Attempts, "sent on the handoff's own claim")
	got, err := f.svc.Get(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, DeliverySent, got.Delivery.State)
	// A round trip on the listening connection lets a notification sent at
	// the commit arrive before the wait.
	_, err = conn.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = conn.Conn().WaitForNotification(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no dispatcher was notified")
}

// The completing transaction's commit fails after the hook wrote and
// registered its handoff: nothing is handed off for it. The pool completes
// the work again, and that commit's signal is the only one sent.
func TestAFailedCompletingCommitHandsNothingOff(t *testing.T) {
	sig := newRecordingSignaler()
	f := newFixtureWith(t, fixtureOptions{signals: sig, handoffLease: time.Hour})
	ctx := context.Background()
	// A deferred trigger fails the first commit that holds a queue message:
	// a failing commit cannot be caused otherwise.
	testkit.FailFirstCommit(t, f.db, "fail_first_wake_commit", "INSERT", "queue_messages", "")

	w, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)

	m := f.requireSignalSent(t, w.ID.String())
	var commits int64
	require.NoError(t, f.db.QueryRow(ctx, `SELECT last_value FROM fail_first_wake_commit_commits`).Scan(&commits))
	require.EqualValues(t, 2, commits, "the first commit failed, the second held the signal")
	require.Equal(t, 1, sig.count("o/wf"), "the failed commit's message was never sent")
	require.Equal(t, 1, m.Attempts)
}

// Outside the pool's hook (here a cancel of a funded intent) there is no
// commit to hand off after: the signal is queued for any dispatcher, which
// the notification wakes.
func TestASignalQueuedOutsideThePoolsHookGoesThroughTheNotifiedQueue(t *testing.T) {
	sig := newRecordingSignaler()
	f := newFixtureWith(t, fixtureOptions{signals: sig, handoffLease: time.Hour})
	ctx := context.Background()
	f.crash = true
	w, err := f.svc.Create(ctx, params(""))
	require.Error(t, err)

	_, err = f.svc.Cancel(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)

	m := f.requireSignalSent(t, w.ID.String())
	require.Equal(t, 1, sig.count("o/wf"))
	require.Equal(t, 1, m.Attempts, "claimed once, on the notification")
}

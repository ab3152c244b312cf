package queue

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/startstop"
	"github.com/reveille/reveille/internal/testkit"
)

const (
	lifecycleWait = 10 * time.Second
	lifecyclePoll = 5 * time.Millisecond
)

// signalLog stands for Temporal (the queue's tests do not link a
// Temporal server; internal/e2e drives a real one): it records each signal.
type signalLog struct {
	mu   sync.Mutex
	sent []string // workflow ids
}

func (r *signalLog) SignalWorkflow(_ context.Context, workflowID, _, _ string, _ any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, workflowID)
	return nil
}

func (r *signalLog) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent)
}

func TestTheDispatcherRunsFromStartUntilStopAndStartsOnce(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	signals := &signalLog{}
	d := NewDispatcher(db, signals, DispatcherConfig{Logger: testkit.Logger(t)})
	require.NoError(t, d.Stop(ctx), "stopping a dispatcher never started is a no-op")

	require.NoError(t, d.Start(ctx))
	err := d.Start(ctx)
	require.ErrorIs(t, err, startstop.ErrStarted)
	require.EqualError(t, err, "queue dispatcher: already started")

	for i := range 3 {
		_, _, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: fmt.Sprint(i),
			Signal: &Signal{WorkflowID: fmt.Sprint("o/wf-", i), Name: "wake"}})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		var delivered int
		return db.QueryRow(ctx, `SELECT count(*) FROM queue_messages WHERE status = 'delivered'`).Scan(&delivered) == nil && delivered == 3
	}, lifecycleWait, lifecyclePoll, "the running dispatcher sends and settles what is due")
	require.Equal(t, 3, signals.count())

	require.NoError(t, d.Stop(ctx))
	require.NoError(t, d.Stop(ctx), "stopping twice is safe")
	require.ErrorIs(t, d.Start(ctx), startstop.ErrStarted, "a stopped dispatcher stays stopped")
}

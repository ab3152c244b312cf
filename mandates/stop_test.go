package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A spend batch whose caller left goes on in the batcher's goroutine; the
// service's Stop waits for it, and past Stop's context cancels it: a batch
// that outlived Stop held a connection of the pool about to close (whose
// Close waits for it) and could commit after the service said it had
// stopped.
func TestStopEndsTheSpendBatchesUnderWay(t *testing.T) {
	s, db := newTestService(t, Config{MaxSpendBatch: 64})
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	require.NoError(t, s.Start(ctx))

	other := testkit.NewPoolFor(t, db.Config().ConnString())
	tx, err := other.Begin(ctx) // an operator's PATCH, under way
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	budget := int64(20)
	_, err = tx.Exec(ctx, qPatchMandate, "org-a", m.ID, &budget, nil, false, nil, "")
	require.NoError(t, err)

	spendCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Spend(spendCtx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5, Reason: "r"})
		done <- err
	}()
	require.Eventually(t, func() bool { return lockWaiters(t, other) > 0 }, testWait, pollEvery, "the spend waits for the PATCH")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	stopCtx, cancelStop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelStop()
	require.ErrorIs(t, s.Stop(stopCtx), context.DeadlineExceeded, "the batch outlasted Stop's context")
	// (a connection whose statement was canceled is closed just after; the
	// server notices once the lock is free, and the spend's outcome is the
	// server's: a caller's retry with its idempotency key finds it)
	require.Eventually(t, func() bool { return db.Stat().AcquiredConns() == 0 }, testWait, pollEvery,
		"a stopped service holds none of its pool's connections")
}

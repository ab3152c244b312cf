package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// startedBehindAPatch starts a service with a mandate of org-a's
// agent-1 (scope llm, budget 10) whose row an operator's PATCH, under way
// in tx on the pool other, holds.
func startedBehindAPatch(t *testing.T) (s *Service, db *pgxpool.Pool, m Mandate, other *pgxpool.Pool, tx pgx.Tx) {
	t.Helper()
	s, db = newTestService(t, Config{MaxSpendBatch: 64})
	ctx := context.Background()
	m = mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	require.NoError(t, s.Start(ctx))
	other = testkit.NewPoolFor(t, db.Config().ConnString())
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	budget := int64(20)
	_, err = tx.Exec(ctx, qPatchMandate, "org-a", m.ID, &budget, nil, false, nil, "")
	require.NoError(t, err)
	return s, db, m, other, tx
}

// A spend batch whose caller left goes on in the batcher's goroutine; the
// service's Stop waits for it, and past Stop's context cancels it: a batch
// that outlived Stop held a connection of the pool about to close (whose
// Close waits for it) and could commit after the service said it had
// stopped.
func TestStopEndsTheSpendBatchesUnderWay(t *testing.T) {
	s, db, _, other, _ := startedBehindAPatch(t)
	ctx := context.Background()

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

// A spend queued behind a batch under way (same mandate: it goes in the
// next batch) is taken by the same drain once Stop has canceled the first:
// Stop waits for the drain, whose context it canceled, so that batch too
// is canceled before Stop returns, rather than beginning after it and
// committing after the service said it had stopped. Here the second
// caller leaves too, as the first did.
func TestStopLeavesNoBatchOfTheSpendsQueuedBehindTheOnesUnderWay(t *testing.T) {
	s, db, m, other, tx := startedBehindAPatch(t)
	ctx := context.Background()

	spend := func(ctx context.Context, cost int64) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: cost, Reason: "r"})
			done <- err
		}()
		return done
	}
	ctx1, cancel1 := context.WithCancel(ctx)
	done1 := spend(ctx1, 3)
	require.Eventually(t, func() bool { return lockWaiters(t, other) > 0 }, testWait, pollEvery, "the spend waits for the PATCH")
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	done2 := spend(ctx2, 5)
	require.Eventually(t, func() bool {
		s.batcher.mu.Lock()
		defer s.batcher.mu.Unlock()
		return len(s.batcher.pending) == 1
	}, testWait, pollEvery, "the second spend waits behind the first batch")
	cancel1()
	require.ErrorIs(t, <-done1, context.Canceled)

	stopCtx, cancelStop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelStop()
	require.ErrorIs(t, s.Stop(stopCtx), context.DeadlineExceeded, "the batch outlasted Stop's context")
	// (the second caller gives up as the first did)
	cancel2()
	require.ErrorIs(t, <-done2, context.Canceled)

	idle := false
	for deadline := time.Now().Add(testWait); time.Now().Before(deadline) && !idle; time.Sleep(pollEvery) {
		s.batcher.mu.Lock()
		idle = s.batcher.running == 0
		s.batcher.mu.Unlock()
	}
	// (the PATCH ends: the batch begun after Stop commits its spend)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, s.batcher.drains.Wait(ctx))
	var spent int64
	require.NoError(t, db.QueryRow(ctx, `SELECT spent FROM mandates WHERE id = $1`, m.ID).Scan(&spent))
	require.True(t, idle, "a stopped service runs no spend batch (and holds none of its pool's connections)")
	require.False(t, spent == 5 || spent == 8, "the second spend, queued before Stop and left by its caller, committed after Stop returned")
}

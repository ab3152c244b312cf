package wakeup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A group of wake-up requests whose callers left goes on in the batcher's
// goroutine; the service's Stop waits for it, and past Stop's context
// cancels it, so that it holds no connection of the pool about to close.
func TestStopEndsTheGroupsOfRequestsUnderWay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := testkit.NewPoolFor(t, f.db.Config().ConnString())
	tx, err := other.Begin(ctx) // the mandate's row held (an operator's PATCH)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM mandates WHERE org_id = 'o' FOR UPDATE`)
	require.NoError(t, err)

	createCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := f.svc.Create(createCtx, params(""))
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n > 0
	}, testWait, testTick, "the request's spend waits for the mandate")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	stopCtx, cancelStop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelStop()
	require.ErrorIs(t, f.svc.Stop(stopCtx), context.DeadlineExceeded, "the group outlasted Stop's context")
	require.Eventually(t, func() bool { return f.db.Stat().AcquiredConns() == 0 }, testWait, testTick,
		"a stopped service holds none of its pool's connections")
}

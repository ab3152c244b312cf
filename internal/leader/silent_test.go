package leader

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// An elector's try for the lock whose answer never comes (its connection
// gone silent after the try reached the server, which granted the lock)
// gives up, and its connection closed lets go of the lock: unbounded, the
// elector waited for the answer for good and no replica led, the lock on a
// session nobody used. Here replica b leads within a few retries of the
// bound.
func TestALockTryWhoseAnswerNeverComesGivesUpAndAnotherReplicaLeads(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	t.Cleanup(relay.Cut)
	cfg, err := pgxpool.ParseConfig(relayed)
	require.NoError(t, err)
	// (the simple protocol sends the statement's text with every try, so
	// that the relay knows a's first try; the lock is free: it is granted)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	dbA, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(dbA.Close)
	dbB := testkit.NewPoolFor(t, dsn)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	arrived, release := relay.HoldReplyTo("pg_try_advisory_lock")
	t.Cleanup(release)
	var ledA, ledB atomic.Bool
	a := &Elector{DB: dbA, Name: "silent", Retry: 200 * time.Millisecond, Logger: testkit.Logger(t)}
	go a.Run(ctx, func(ctx context.Context) { ledA.Store(true); <-ctx.Done() })
	<-arrived // a's try ran on the server; its answer never comes back
	var holders int
	require.NoError(t, dbB.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&holders))
	require.Equal(t, 1, holders, "a's try was granted on the server")

	b := &Elector{DB: dbB, Name: "silent", Retry: 200 * time.Millisecond, Logger: testkit.Logger(t)}
	go b.Run(ctx, func(ctx context.Context) { ledB.Store(true); <-ctx.Done() })
	require.Eventually(t, func() bool { return ledA.Load() || ledB.Load() }, 20*time.Second, 10*time.Millisecond,
		"no replica leads: the lock sits on a session nobody uses")
}

// A fenced transaction's own round trips whose answer never comes (its
// connection gone silent) give up after StatementTimeout: a leader's task
// runs under its leadership's context, which a healthy lock connection
// never ends, so the task stopped for every replica.
func TestAFencedTransactionsOwnRoundTripsGiveUp(t *testing.T) {
	for _, tc := range []struct{ name, marker string }{
		{"fence", "set_config('idle_in_transaction_session_timeout', $3, true)"},
		{"commit", "commit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			relay, relayed := testkit.NewRelay(t, testkit.NewDatabase(t))
			pool := testkit.NewPoolFor(t, relayed)
			term, err := NewTerm(context.Background(), pool, "silent")
			require.NoError(t, err)
			ctx := WithTerm(context.Background(), term)
			_, release := relay.HoldReplyTo(tc.marker)
			t.Cleanup(release)
			done := make(chan error, 1)
			go func() {
				done <- FencedTx(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				})
			}()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.DeadlineExceeded)
			case <-time.After(StatementTimeout + 20*time.Second):
				t.Fatal("the fenced transaction never gave up")
			}
		})
	}
}

// A sweep's scan runs under StatementTimeout, whatever its caller's
// context (see TestAFencedTransactionsOwnRoundTripsGiveUp).
func TestASweepsScanIsBoundedByTheStatementTimeout(t *testing.T) {
	var left time.Duration
	_, err := SweepBatches(context.Background(), 10, func(ctx context.Context, _ *int, _ int) ([]int, error) {
		deadline, ok := ctx.Deadline()
		require.True(t, ok, "the scan has a deadline")
		left = time.Until(deadline)
		return nil, nil
	}, func(context.Context, int) (bool, error) { return true, nil }, func(int, error) {})
	require.NoError(t, err)
	require.LessOrEqual(t, left, StatementTimeout)
}

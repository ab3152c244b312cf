package leader

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	cfg.MaxConns = 1 // (so that a's tries after the first send no Parse: only the prepared statement's name)
	dbA, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(dbA.Close)
	dbB := testkit.NewPoolFor(t, dsn)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// Someone else holds the lock while a's connection prepares its try.
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = other.Exec(ctx, "SELECT pg_advisory_lock($1)", Key("gaps"))
	require.NoError(t, err)

	var ledA, ledB atomic.Bool
	a := &Elector{DB: dbA, Name: "gaps", Retry: 200 * time.Millisecond, Logger: testkit.Logger(t)}
	go a.Run(ctx, func(ctx context.Context) { ledA.Store(true); <-ctx.Done() })
	time.Sleep(time.Second) // a tried (and failed) a few times: its statement is prepared
	digest := sha256.Sum256([]byte("SELECT pg_try_advisory_lock($1)"))
	arrived, release := relay.HoldReplyTo("stmtcache_" + hex.EncodeToString(digest[0:24]))
	t.Cleanup(release)
	require.NoError(t, other.Close(ctx)) // the lock is free
	select {
	case <-arrived: // a's next try ran on the server and was granted; its answer never comes back
	case <-time.After(10 * time.Second):
		t.Fatal("a's try never went out")
	}
	var holders int
	require.NoError(t, dbB.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&holders))
	require.Equal(t, 1, holders, "a's try was granted on the server")

	b := &Elector{DB: dbB, Name: "gaps", Retry: 200 * time.Millisecond, Logger: testkit.Logger(t)}
	go b.Run(ctx, func(ctx context.Context) { ledB.Store(true); <-ctx.Done() })
	require.Eventually(t, func() bool { return ledA.Load() || ledB.Load() }, 20*time.Second, 10*time.Millisecond,
		"no replica leads: the lock sits on a session nobody uses (retry 200 ms, lease %s)", LeaseFor(200*time.Millisecond))
}

// A statement of a fenced transaction whose answer never comes (its
// connection gone silent) gives up after StatementTimeout: a leader's task
// runs under its leadership's context, which a healthy lock connection
// never ends, so the task stopped for every replica.
func TestAFencedStatementWhoseAnswerNeverComesGivesUp(t *testing.T) {
	t.Parallel()
	const marker = "reveille: a fenced statement"
	relay, relayed := testkit.NewRelay(t, testkit.NewDatabase(t))
	pool := testkit.NewPoolFor(t, relayed)
	_, release := relay.HoldReplyTo(marker)
	t.Cleanup(release)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		done <- FencedTx(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT '"+marker+"'")
			return err
		})
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(StatementTimeout + 20*time.Second):
		t.Fatal("the fenced statement never gave up")
	}
}

// A sweep's scan runs under StatementTimeout, whatever its caller's
// context (see TestAFencedStatementWhoseAnswerNeverComesGivesUp).
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

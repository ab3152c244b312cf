package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

// Every kind of round trip of a bound transaction whose answer never comes
// (a connection gone silent) gives up with the bound and closes the
// connection, rather than waiting for the kernel.
func TestARoundTripOfABoundTransactionWhoseAnswerNeverComesGivesUp(t *testing.T) {
	const marker = "reveille: a silent round trip"
	for _, tc := range []struct {
		name string
		trip func(ctx context.Context, tx pgx.Tx) error
	}{
		{"exec", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT '"+marker+"'")
			return err
		}},
		{"query", func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT '"+marker+"'")
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		}},
		{"query row", func(ctx context.Context, tx pgx.Tx) error {
			var s string
			return tx.QueryRow(ctx, "SELECT '"+marker+"'").Scan(&s)
		}},
		{"batch", func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT '" + marker + "'")
			return tx.SendBatch(ctx, b).Close()
		}},
		{"savepoint's statement", func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp.Exec(ctx, "SELECT '"+marker+"'")
			return err
		}},
		{"commit", func(ctx context.Context, tx pgx.Tx) error {
			return tx.Commit(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			relay, relayed := testkit.NewRelay(t, testkit.NewDatabase(t))
			conn, err := pgx.Connect(context.Background(), relayed)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			begun, err := conn.Begin(context.Background())
			require.NoError(t, err)
			tx := db.BoundRoundTrips(begun, 300*time.Millisecond)
			hold := marker
			if tc.name == "commit" {
				hold = "commit" // (as pgx sends it)
			}
			_, release := relay.HoldReplyTo(hold)
			t.Cleanup(release)
			err = tc.trip(context.Background(), tx)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.True(t, conn.IsClosed())
		})
	}
}

// The bound is on each round trip, not on the transaction: one whose
// statements each answer within it commits however long it lasts in all
// (a record whose hook calls take long).
func TestABoundTransactionLongerThanItsBoundCommits(t *testing.T) {
	pool := testkit.NewPoolFor(t, testkit.NewDatabase(t))
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE TABLE bound_trips (n int)")
	require.NoError(t, err)
	begun, err := pool.Begin(ctx)
	require.NoError(t, err)
	tx := db.BoundRoundTrips(begun, 2*time.Second)
	for n := range 3 {
		_, err := tx.Exec(ctx, "SELECT pg_sleep(0.8)")
		require.NoError(t, err)
		var got int
		require.NoError(t, tx.QueryRow(ctx, "INSERT INTO bound_trips VALUES ($1) RETURNING n", n).Scan(&got))
		rows, err := tx.Query(ctx, "SELECT n FROM bound_trips ORDER BY n")
		require.NoError(t, err)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		require.Len(t, ns, n+1)
	}
	require.NoError(t, tx.Commit(ctx))
	var count int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM bound_trips").Scan(&count))
	require.Equal(t, 3, count)
}

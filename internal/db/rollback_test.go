package db_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

func TestRollbackOpenEndsATransactionLeftOpenEvenPastItsContext(t *testing.T) {
	conn, err := pgx.Connect(context.Background(), testkit.NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "BEGIN")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	db.RollbackOpen(ctx, conn)
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())
	require.False(t, conn.IsClosed())
}

// A ROLLBACK whose answer never comes (a connection gone silent) gives up
// and closes the connection, rather than holding its caller — and a Stop
// waiting for it — until the kernel gives up.
func TestRollbackOpenOnASilentConnectionClosesIt(t *testing.T) {
	relay, relayed := testkit.NewRelay(t, testkit.NewDatabase(t))
	conn, err := pgx.Connect(context.Background(), relayed)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "BEGIN")
	require.NoError(t, err)
	_, release := relay.HoldReplyTo("ROLLBACK")
	t.Cleanup(release)
	db.RollbackOpen(context.Background(), conn)
	require.True(t, conn.IsClosed())
}

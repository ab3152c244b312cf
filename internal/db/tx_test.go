package db_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// ownedConn is a connection wrapped by its owner (as the wake-up gate
// wraps its own), which InTx cannot see through to the *pgx.Conn.
type ownedConn struct{ *pgx.Conn }

func TestInTxJoinsBeginsOrRefusesAsItsQuerierIs(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE t (n int)`)
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
		return n
	}
	insert := func(tx pgx.Tx) error { _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); return err }
	failed := errors.New("failed")

	t.Run("on a pool it begins, commits, and rolls back on f's error", func(t *testing.T) {
		require.NoError(t, db.InTx(ctx, pool, insert))
		require.Equal(t, 1, count())
		require.ErrorIs(t, db.InTx(ctx, pool, func(tx pgx.Tx) error { _ = insert(tx); return failed }), failed)
		require.Equal(t, 1, count())
	})

	inOwnersTx := func(t *testing.T, q func(*pgxpool.Conn) db.Querier) (status string, err error) {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		err = db.InTx(ctx, q(conn), insert)
		status = string(conn.Conn().PgConn().TxStatus())
		_, rerr := conn.Exec(ctx, "ROLLBACK")
		require.NoError(t, rerr)
		return status, err
	}
	for _, tc := range []struct {
		name string
		q    func(*pgxpool.Conn) db.Querier
	}{
		{"a pool's connection", func(c *pgxpool.Conn) db.Querier { return c }},
		{"a pgx connection", func(c *pgxpool.Conn) db.Querier { return c.Conn() }},
		{"a joined transaction", func(c *pgxpool.Conn) db.Querier { return db.JoinedTx(c.Conn()) }},
	} {
		t.Run("on "+tc.name+" inside its owner's transaction it joins it", func(t *testing.T) {
			before := count()
			status, err := inOwnersTx(t, tc.q)
			require.NoError(t, err)
			require.Equal(t, "T", status, "the owner's transaction is still open")
			require.Equal(t, before, count(), "rolled back with it")
		})
	}
	t.Run("on a connection it cannot reach inside its owner's transaction it refuses", func(t *testing.T) {
		before := count()
		status, err := inOwnersTx(t, func(c *pgxpool.Conn) db.Querier { return ownedConn{c.Conn()} })
		require.ErrorContains(t, err, "pass it as db.JoinedTx")
		require.Equal(t, "T", status)
		require.Equal(t, before, count())
	})
}

func TestAJoinedTransactionEndsOnlyItsSavepoints(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `CREATE TABLE t (n int); BEGIN`)
	require.NoError(t, err)
	tx := db.JoinedTx(conn.Conn())

	require.ErrorIs(t, tx.Commit(ctx), db.ErrTxOwned)
	require.ErrorIs(t, tx.Rollback(ctx), db.ErrTxOwned)
	kept, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = kept.Exec(ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.NoError(t, kept.Commit(ctx))
	undone, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = undone.Exec(ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, err)
	require.NoError(t, undone.Rollback(ctx))
	_, err = conn.Exec(ctx, "COMMIT")
	require.NoError(t, err)

	var got []int
	rows, err := pool.Query(ctx, `SELECT n FROM t`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1}, got, "the released savepoint's row is kept, the rolled-back one's is not")
}

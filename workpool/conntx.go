package workpool

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connTx is a transaction opened by a BEGIN sent in the same pipeline as
// its first statements, which pgx.Tx cannot do: it saves the report its
// BEGIN round trip. It is what the hooks see (through hookTx); nested
// Begin makes savepoints.
type connTx struct {
	conn  *pgx.Conn
	depth int
}

var _ pgx.Tx = (*connTx)(nil)

// Begin opens a savepoint.
func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp := &connTx{conn: t.conn, depth: t.depth + 1}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name()); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *connTx) name() string { return "workpool_sp_" + strconv.Itoa(t.depth) }

// Commit releases a savepoint, or commits the transaction itself. Like
// pgx's own, it reports a COMMIT that rolled back (the transaction had
// failed) as pgx.ErrTxCommitRollback.
func (t *connTx) Commit(ctx context.Context) error {
	if t.depth > 0 {
		_, err := t.conn.Exec(ctx, "RELEASE SAVEPOINT "+t.name())
		return err
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return err
}

// Rollback rolls back to a savepoint, or the transaction itself.
func (t *connTx) Rollback(ctx context.Context) error {
	sql := "ROLLBACK"
	if t.depth > 0 {
		sql = "ROLLBACK TO SAVEPOINT " + t.name()
	}
	_, err := t.conn.Exec(ctx, sql)
	return err
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not offered to hooks.
func (t *connTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Conn() *pgx.Conn { return t.conn }

// recordWithHooks records results and runs their hooks in one transaction
// whose BEGIN travels with the statement: two round trips in all
// (statement, commit) when every hook succeeds. What the hooks handed over
// with AfterCommit runs once the commit is acknowledged.
func (m *Manager) recordWithHooks(ctx context.Context, results []attemptResult) (done []finishedRow, err error) {
	c, err := m.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("completing %d attempts: %w", len(results), err)
	}
	defer c.Release()
	conn := c.Conn()
	defer func() {
		if err != nil && conn.PgConn().TxStatus() != 'I' {
			// Best effort: a broken connection is closed by the pool.
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				_ = conn.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	tx := &connTx{conn: conn}
	hctx, actions := withCommitActions(ctx)
	if done, err = m.completeIn(hctx, tx, results, true); err != nil {
		return nil, err
	}
	if err = tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing %d completions: %w", len(results), err)
	}
	actions.run()
	return done, nil
}

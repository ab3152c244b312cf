package workpool

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
)

// connTx is a transaction opened by a BEGIN sent in the same pipeline as
// its first statements, which pgx.Tx cannot do: it saves the report its
// BEGIN round trip. It is what the hooks see (through hookTx): db.JoinedTx,
// whose nested Begin makes savepoints, and which the completer, its owner,
// commits or rolls back itself.
type connTx struct{ pgx.Tx }

func newConnTx(conn *pgx.Conn) connTx { return connTx{db.JoinedTx(conn)} }

// Commit commits the transaction. Like pgx's own, it reports a COMMIT that
// rolled back (the transaction had failed) as pgx.ErrTxCommitRollback.
func (t connTx) Commit(ctx context.Context) error {
	tag, err := t.Conn().Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return err
}

// Rollback rolls the transaction back.
func (t connTx) Rollback(ctx context.Context) error {
	_, err := t.Conn().Exec(ctx, "ROLLBACK")
	return err
}

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
		if err != nil {
			db.RollbackOpen(ctx, conn)
		}
	}()
	// Its hooks' round trips (completeIn) and its commit are bounded, not
	// the transaction: its hook calls may take long, but an answer that
	// never comes (a connection gone silent) would hold up every later
	// result of this replica until the kernel gave up on the connection.
	tx := newConnTx(conn)
	hctx, actions := db.WithAfterCommit(ctx)
	if done, err = m.completeIn(hctx, tx, results, true, time.Time{}); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.StatementTimeout)
	defer cancel()
	if err = tx.Commit(cctx); err != nil {
		return nil, fmt.Errorf("committing %d completions: %w", len(results), err)
	}
	actions.Run()
	return done, nil
}

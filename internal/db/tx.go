package db

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is what Commit and Rollback of a JoinedTx's outermost level
// return: only the code that began the transaction ends it.
var ErrTxOwned = errors.New("db: the transaction is ended by the code that began it")

// JoinedTx is a pgx.Tx view of the transaction conn is already in, one its
// owner began with a BEGIN of its own (sent in a pipeline with its first
// statements, which saves the round trip pgx's Begin takes). Code that
// joins a caller's transaction when handed a pgx.Tx then writes in the
// owner's transaction; handed the bare connection, it would begin its own —
// Postgres ignores a BEGIN inside a transaction, with a warning — and its
// COMMIT would commit the owner's work half done. Begin makes savepoints;
// Commit and Rollback end only those (ErrTxOwned at the outermost level).
func JoinedTx(conn *pgx.Conn) pgx.Tx { return &joinedTx{conn: conn} }

type joinedTx struct {
	conn  *pgx.Conn
	depth int // 0: the owner's transaction; n: the n-th savepoint in it
}

func (t *joinedTx) savepoint() string { return "db_joined_" + strconv.Itoa(t.depth) }

func (t *joinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp := &joinedTx{conn: t.conn, depth: t.depth + 1}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.savepoint()); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *joinedTx) Commit(ctx context.Context) error {
	if t.depth == 0 {
		return ErrTxOwned
	}
	_, err := t.conn.Exec(ctx, "RELEASE SAVEPOINT "+t.savepoint())
	return err
}

func (t *joinedTx) Rollback(ctx context.Context) error {
	if t.depth == 0 {
		return ErrTxOwned
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+t.savepoint())
	return err
}

func (t *joinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *joinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not offered.
func (t *joinedTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *joinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *joinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *joinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *joinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *joinedTx) Conn() *pgx.Conn { return t.conn }

// InTx runs f in q's transaction: q itself when it is a pgx.Tx, the
// transaction a connection (*pgx.Conn, or one that has Conn, as
// *pgxpool.Conn does) is already in (JoinedTx), or else a new transaction
// on q, which f's error rolls back. A connection in a transaction that it
// cannot reach as a *pgx.Conn is an error, never a transaction of its own.
func InTx(ctx context.Context, q Querier, f func(pgx.Tx) error) error {
	if tx, ok := q.(pgx.Tx); ok {
		return f(tx)
	}
	var conn *pgx.Conn
	switch c := q.(type) {
	case *pgx.Conn:
		conn = c
	case interface{ Conn() *pgx.Conn }:
		conn = c.Conn()
	}
	if conn != nil && conn.PgConn().TxStatus() != 'I' {
		return f(JoinedTx(conn))
	}
	if c, ok := q.(interface{ PgConn() *pgconn.PgConn }); ok && conn == nil && c.PgConn().TxStatus() != 'I' {
		return fmt.Errorf("db: %T is in a transaction its owner began: pass it as db.JoinedTx", q)
	}
	b, ok := q.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		return fmt.Errorf("db: %T can neither join nor begin a transaction", q)
	}
	return pgx.BeginFunc(ctx, b, f)
}

// rollbackTimeout bounds RollbackOpen's ROLLBACK: on a connection gone
// silent it would wait for the kernel, minutes, holding up its caller
// (and a Stop waiting for it).
const rollbackTimeout = 5 * time.Second

// RollbackOpen ends a transaction a failure left open on conn (a bare
// BEGIN sent in a batch); a connection that cannot is closed, so that its
// pool drops it. It runs even when ctx has ended.
func RollbackOpen(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Close(ctx)
	}
}

package db

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// BoundRoundTrips is tx whose every round trip — a statement, a batch, a
// savepoint, the commit — gives up after d: the context it runs under is
// cut at d, and pgx closes a connection whose answer did not come in time.
// A transaction's statements each wait on the server for as long as they
// must, so a bound on the transaction as a whole would cut a long but
// legitimate one (many hook calls) at the same place on every try; a bound
// on each round trip only cuts one whose answer never comes — a connection
// gone silent (a NAT that forgot it, a failover that blackholed the old
// primary's connections), which would otherwise wait for the kernel,
// minutes. d must exceed the longest a statement of the transaction may
// run on the server, lock waits included.
//
// Rows are bounded until they are read to the end or closed, a Row until
// it is scanned, a batch's results until they are closed, by d for each
// of the batch's statements.
func BoundRoundTrips(tx pgx.Tx, d time.Duration) pgx.Tx { return boundTx{Tx: tx, d: d} }

type boundTx struct {
	pgx.Tx
	d time.Duration
}

func (t boundTx) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.d)
}

func (t boundTx) Begin(ctx context.Context) (pgx.Tx, error) {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return boundTx{Tx: tx, d: t.d}, nil
}

func (t boundTx) Commit(ctx context.Context) error {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	return t.Tx.Commit(ctx)
}

func (t boundTx) Rollback(ctx context.Context) error {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	return t.Tx.Rollback(ctx)
}

func (t boundTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	return t.Tx.Exec(ctx, sql, args...)
}

func (t boundTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	ctx, cancel := t.bound(ctx)
	rows, err := t.Tx.Query(ctx, sql, args...)
	if err != nil {
		cancel()
		return rows, err
	}
	return boundRows{Rows: rows, cancel: cancel}, nil
}

func (t boundTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, cancel := t.bound(ctx)
	return boundRow{row: t.Tx.QueryRow(ctx, sql, args...), cancel: cancel}
}

func (t boundTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	// (d for each of its statements: each may take what one statement may)
	ctx, cancel := context.WithTimeout(ctx, t.d*time.Duration(max(len(b.QueuedQueries), 1)))
	return boundBatchResults{BatchResults: t.Tx.SendBatch(ctx, b), cancel: cancel}
}

func (t boundTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t boundTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	ctx, cancel := t.bound(ctx)
	defer cancel()
	return t.Tx.Prepare(ctx, name, sql)
}

// boundRows releases its bound once read to the end or closed.
type boundRows struct {
	pgx.Rows
	cancel context.CancelFunc
}

func (r boundRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.cancel() // (the rows closed themselves)
	return false
}

func (r boundRows) Close() {
	r.Rows.Close()
	r.cancel()
}

// boundRow releases its bound once scanned.
type boundRow struct {
	row    pgx.Row
	cancel context.CancelFunc
}

func (r boundRow) Scan(dest ...any) error {
	defer r.cancel()
	return r.row.Scan(dest...)
}

// boundBatchResults releases its bound once closed.
type boundBatchResults struct {
	pgx.BatchResults
	cancel context.CancelFunc
}

func (r boundBatchResults) Close() error {
	defer r.cancel()
	return r.BatchResults.Close()
}

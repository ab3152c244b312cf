// Package db holds what every domain package needs from a database
// connection, so that a call runs inside the caller's transaction or on its
// own through one interface: pgx.Tx, *pgxpool.Pool and *pgx.Conn all
// satisfy it; InTx runs code in the caller's transaction whichever of them
// it is handed, and JoinedTx shows a transaction begun by a bare BEGIN as a
// pgx.Tx. It is a leaf: it imports only pgx.
package db

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements on a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Batcher is a Querier that also pipelines a batch of statements in one
// round trip (all three satisfy it too).
type Batcher interface {
	Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

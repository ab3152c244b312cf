package db

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// BatchResults is pgx.BatchResults whose Close may be called again: a
// second call returns the first call's error and does nothing else. Code
// that defers Close (so that a panic while reading gives the connection
// back) and also closes explicitly (to read the commit's error) needs it:
// pgx's own second Close, after a batch that failed, invalidates the
// statement caches of the connection it ran on (pgx v5.12) — which on a
// pool the first Close has already handed to another goroutine.
type BatchResults struct {
	pgx.BatchResults
	closed bool
	err    error
}

// SendBatch sends b on q and returns its results, closable twice.
func SendBatch(ctx context.Context, q Batcher, b *pgx.Batch) *BatchResults {
	return &BatchResults{BatchResults: q.SendBatch(ctx, b)}
}

// Close closes the results once.
func (r *BatchResults) Close() error {
	if !r.closed {
		r.closed = true
		r.err = r.BatchResults.Close()
	}
	return r.err
}

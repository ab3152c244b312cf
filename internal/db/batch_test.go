package db_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

// countedResults counts the Close calls that reach the batch under it.
type countedResults struct {
	pgx.BatchResults
	closes int
	err    error
}

func (c *countedResults) Close() error { c.closes++; return c.err }

type countedBatcher struct {
	db.Batcher
	results *countedResults
}

func (b countedBatcher) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return b.results }

func TestClosingBatchResultsAgainReturnsTheFirstErrorAndClosesNothing(t *testing.T) {
	failed := errors.New("the batch failed")
	under := &countedResults{err: failed}
	br := db.SendBatch(context.Background(), countedBatcher{results: under}, &pgx.Batch{})
	require.ErrorIs(t, br.Close(), failed)
	require.ErrorIs(t, br.Close(), failed)
	require.Equal(t, 1, under.closes)
}

// A batch that failed, closed and then closed again by a deferred Close,
// leaves the pooled connection alone once the first Close gave it back:
// pgx's own second Close invalidates the connection's statement cache
// while the connection's next user fills it (a data race, seen by -race).
func TestAFailedBatchClosedTwiceLeavesItsPooledConnectionToItsNextUser(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	const failing = "SELECT 1/$1::int"
	var one int
	require.NoError(t, pool.QueryRow(ctx, failing, 1).Scan(&one)) // (in the cache)

	for round := range 20 {
		b := &pgx.Batch{}
		b.Queue(failing, 0)
		var next sync.WaitGroup
		func() {
			br := db.SendBatch(ctx, pool, b)
			defer br.Close()
			_, err := br.Exec()
			require.Error(t, err, "division by zero")
			// The connection's next user waits for it, and prepares new
			// statements (its cache's map written) as soon as it has it.
			next.Go(func() {
				var n int
				for i := range 5 {
					if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT %d + $1::int", round*10+i), 1).Scan(&n); err != nil {
						t.Error(err)
					}
				}
				if err := pool.QueryRow(ctx, failing, 1).Scan(&n); err != nil {
					t.Error(err)
				}
			})
			require.Error(t, br.Close())
		}()
		next.Wait()
	}
}

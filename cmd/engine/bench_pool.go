package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/migrations"
	"github.com/reveille/reveille/workpool"
)

func init() { benches["pool"] = benchPool }

// benchPoolName is the pool the benchmark fills and drains; its work is
// deleted before each run.
const benchPoolName = "bench"

// benchPool enqueues n no-op work items that each carry an onComplete hook
// (in batches, as River's InsertMany does), then starts the pool and times
// the burn-down until every item's completion is committed.
func benchPool(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench pool", flag.ContinueOnError)
	n := fs.Int("n", 50000, "work items")
	parallelism := fs.Int("parallelism", 100, "the pool's max_parallelism")
	batch := fs.Int("batch", 1000, "items per EnqueueMany")
	hook := fs.Bool("hook", true, "give every item an onComplete hook")
	dataDir := fs.String("data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the burn-down to this file")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: engine bench pool [flags]\n\nUses DATABASE_URL, or else starts a local Postgres (default, durable settings).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *parallelism < 1 || *parallelism > workpool.MaxParallelismLimit || *batch < 1 {
		return errors.New("need n ≥ 1, 1 ≤ parallelism ≤ 10000, batch ≥ 1")
	}
	db, stop, err := benchDatabase(ctx, *dataDir, func(c *pgxpool.Config) { c.MaxConns = int32(min(max(*parallelism/10, 16), 64)) })
	if err != nil {
		return err
	}
	defer stop()
	if _, err := migrations.UpPool(ctx, db, nil); err != nil {
		return err
	}
	if err := poolBenchReset(ctx, db); err != nil {
		return err
	}

	m, err := workpool.New(db, workpool.Config{
		Pools:  map[string]int{benchPoolName: *parallelism},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// The one bench org enqueues all n items before the pool starts:
		// the cap is counted as in production but never reached.
		MaxPendingPerOrg: max(*n, workpool.DefaultMaxPendingPerOrg),
	})
	if err != nil {
		return err
	}
	if err := m.SetMaxParallelism(ctx, benchPoolName, *parallelism); err != nil {
		return err
	}
	var handled, hooked atomic.Int64
	m.Register("bench.noop", func(context.Context, workpool.Job) (json.RawMessage, error) {
		handled.Add(1)
		return nil, nil
	})
	m.RegisterHook("bench.hook", func(context.Context, pgx.Tx, workpool.Completion) error {
		hooked.Add(1)
		return nil
	})

	org := "bench-" + uuid.NewString()
	params := make([]workpool.EnqueueParams, 0, *batch)
	t0 := time.Now()
	for i := range *n {
		p := workpool.EnqueueParams{OrgID: org, Pool: benchPoolName, Handler: "bench.noop", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		if *hook {
			p.OnComplete = &workpool.OnComplete{Hook: "bench.hook", Context: json.RawMessage(`{}`)}
		}
		params = append(params, p)
		if len(params) == *batch || i == *n-1 {
			if _, err := m.EnqueueMany(ctx, params); err != nil {
				return fmt.Errorf("enqueue: %w", err)
			}
			params = params[:0]
		}
	}
	enqueue := time.Since(t0)

	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	t1 := time.Now()
	if err := m.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = m.Stop(context.Background()) }()
	worked, err := poolBenchWait(ctx, db, *n, &handled)
	if err != nil {
		return err
	}
	burndown := time.Since(t1)
	fmt.Printf("pool: n=%d parallelism=%d enqueue=%.0f jobs/s burndown=%.0f jobs/s\n",
		*n, *parallelism, float64(*n)/enqueue.Seconds(), float64(*n)/burndown.Seconds())
	fmt.Fprintf(os.Stderr, "pool: handlers done after %s (%.0f jobs/s), every completion committed after %s, hooks run %d\n",
		worked.Round(time.Millisecond), float64(*n)/worked.Seconds(), burndown.Round(time.Millisecond), hooked.Load())
	return nil
}

// poolBenchWait waits until every handler ran and then until every item is
// finished in the database, returning when the handlers were done.
func poolBenchWait(ctx context.Context, db *pgxpool.Pool, n int, handled *atomic.Int64) (time.Duration, error) {
	t0 := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var worked time.Duration
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		if handled.Load() < int64(n) {
			continue
		}
		if worked == 0 {
			worked = time.Since(t0)
		}
		var finished int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE pool = $1 AND state = 'finished'`, benchPoolName).Scan(&finished); err != nil {
			return 0, fmt.Errorf("counting finished work: %w", err)
		}
		if finished >= n {
			return worked, nil
		}
	}
}

// poolBenchReset empties the bench pool of earlier runs' work.
func poolBenchReset(ctx context.Context, db *pgxpool.Pool) error {
	for _, sql := range []string{
		`DELETE FROM workpool_cancelations WHERE pool = 'bench'`,
		`DELETE FROM workpool_work WHERE pool = 'bench'`,
		`DELETE FROM workpool_org_pending WHERE pool = 'bench'`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			return fmt.Errorf("resetting the bench pool: %w", err)
		}
	}
	if _, err := db.Exec(ctx, `VACUUM ANALYZE workpool_work`); err != nil {
		return fmt.Errorf("vacuuming: %w", err)
	}
	return nil
}

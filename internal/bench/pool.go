package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// poolName is the pool the benchmark fills and drains.
const poolName = "bench"

// PoolConfig is one `engine bench pool` run.
type PoolConfig struct {
	// Service is the engine's configuration; the run replaces its
	// database, pools and API.
	Service service.Config
	// N work items, enqueued in batches of Batch into a pool of
	// max_parallelism Parallelism; Hook gives each an onComplete hook.
	N, Parallelism, Batch int
	Hook                  bool
	// DataDir is where a local Postgres starts when Service has no
	// database (a temporary directory when empty).
	DataDir string
	// CPUProfile, when set, is the file the burn-down's CPU profile goes to.
	CPUProfile string
	// Orgs, when 2 or more, times the burn-down of the n items spread over
	// that many orgs (fair share) beside one org's, in Rounds alternating
	// pairs (PoolFairShare). Both at least 1, as given: a 0 is refused, not
	// read as 1; and N at least Orgs, each org getting a block of the items.
	Orgs, Rounds int
}

// poolService builds the engine of a pool bench on a fresh database: the
// bench pool at c.Parallelism, connections for it, and a pending cap the
// bench's enqueues (all n items before the pool starts) are counted against
// as in production but never reach. The caller closes the service, then
// tears w down (also when err is set).
func poolService(ctx context.Context, c PoolConfig) (*service.Service, *where, error) {
	w, err := setUp(ctx, c.Service, "pool", c.DataDir, false)
	if err != nil {
		return nil, w, err
	}
	cfg, _ := serviceConfig(c.Service, w, quiet)
	cfg.ConfigureDB = func(pc *pgxpool.Config) { pc.MaxConns = int32(min(max(c.Parallelism/10, 16), 64)) }
	// (and the wake-ups' pool, which a service will not start without: idle)
	cfg.Workpool.Pools = map[string]int{poolName: c.Parallelism, wakeup.DefaultPool: 1}
	cfg.Workpool.MaxPendingPerOrg = max(c.N, workpool.DefaultMaxPendingPerOrg)
	svc, err := service.New(ctx, cfg)
	return svc, w, err
}

// Pool enqueues n no-op work items that each carry an onComplete hook (in
// batches, as River's InsertMany does), then starts the service and times
// the burn-down until every item's completion is committed.
func Pool(ctx context.Context, c PoolConfig) error {
	if c.N < 1 || c.Parallelism < 1 || c.Parallelism > workpool.MaxParallelismLimit || c.Batch < 1 {
		return errors.New("need n ≥ 1, 1 ≤ parallelism ≤ 10000, batch ≥ 1")
	}
	if c.Orgs < 1 || c.Rounds < 1 {
		return errors.New("need orgs ≥ 1, rounds ≥ 1")
	}
	if c.N < c.Orgs {
		// (the fair-share burn-down gives every org a block of the n items)
		return fmt.Errorf("need n ≥ orgs: each of the %d orgs needs at least one of the %d items", c.Orgs, c.N)
	}
	if c.Orgs > 1 {
		return poolFairShare(ctx, c)
	}
	svc, w, err := poolService(ctx, c)
	defer w.tearDown(false)
	if err != nil {
		return err
	}
	defer svc.Close()
	// Dropping the run's database at the end makes Postgres checkpoint, so
	// whatever runs next (River's half of an interleaved pair) starts just
	// after one, paying a full-page write for every page it first touches.
	// This run starts after one too, so that both pay alike.
	if _, err := svc.DB().Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(os.Stderr, "pool: no checkpoint before the run (%v): the comparison with the next run is uneven\n", err)
	}
	m := svc.Workpool()
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
	params := make([]workpool.EnqueueParams, 0, c.Batch)
	t0 := time.Now()
	for i := range c.N {
		p := workpool.EnqueueParams{OrgID: org, Pool: poolName, Handler: "bench.noop", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		if c.Hook {
			p.OnComplete = &workpool.OnComplete{Hook: "bench.hook", Context: json.RawMessage(`{}`)}
		}
		params = append(params, p)
		if len(params) == c.Batch || i == c.N-1 {
			if _, err := m.EnqueueMany(ctx, params); err != nil {
				return fmt.Errorf("enqueue: %w", err)
			}
			params = params[:0]
		}
	}
	enqueue := time.Since(t0)

	stopProfile, err := startCPUProfile(c.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	t1 := time.Now()
	r, err := start(ctx, svc)
	if err != nil {
		return err
	}
	defer r.stop()
	worked, err := poolWait(ctx, m, org, c.N, &handled, r)
	if err != nil {
		return err
	}
	burndown := time.Since(t1)
	fmt.Printf("pool: n=%d parallelism=%d enqueue=%.0f jobs/s burndown=%.0f jobs/s\n",
		c.N, c.Parallelism, float64(c.N)/enqueue.Seconds(), float64(c.N)/burndown.Seconds())
	fmt.Fprintf(os.Stderr, "pool: handlers done after %s (%.0f jobs/s), every completion committed after %s, hooks run %d\n",
		worked.Round(time.Millisecond), float64(c.N)/worked.Seconds(), burndown.Round(time.Millisecond), hooked.Load())
	return nil
}

// poolWait waits until every handler ran and then until the pool reports
// every item of org finished, returning when the handlers were done.
func poolWait(ctx context.Context, m *workpool.Manager, org string, n int, handled *atomic.Int64, r *running) (time.Duration, error) {
	t0 := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var worked time.Duration
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-r.done:
			return 0, fmt.Errorf("the service stopped during the burn-down: %v", r.err)
		case <-tick.C:
		}
		if handled.Load() < int64(n) {
			continue
		}
		if worked == 0 {
			worked = time.Since(t0)
		}
		p, err := m.Pool(ctx, org, poolName)
		if err != nil {
			return 0, fmt.Errorf("counting finished work: %w", err)
		}
		if p.Report.Completed >= int64(n) {
			return worked, nil
		}
	}
}

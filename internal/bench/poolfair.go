package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/workpool"
)

// fairPhase is one burn-down of the fair-share benchmark.
type fairPhase struct {
	rate float64 // items per second, resume to the last completion committed
	// p99 start lag (from the resume) of the org whose p99 is the worst,
	// and of the one whose is the best.
	worstP99, bestP99 time.Duration
}

// poolFairShare times, on one running service, burn-downs of n items of
// one org and of n items spread over c.Orgs orgs, in c.Rounds pairs whose
// order alternates (so that neither side always runs on the other's dead
// rows). Each burn-down enqueues into the paused pool, in org blocks (the
// worst order for plain FIFO: the last org would wait for all the others),
// vacuums and checkpoints, and times from the resume until every
// completion is committed. With one
// org the loop starts work on its fast path; with several, every start is
// the fair one (weights, caps and keys unused: plain fair share).
func poolFairShare(ctx context.Context, c PoolConfig) error {
	svc, w, err := poolService(ctx, c)
	defer w.tearDown(false)
	if err != nil {
		return err
	}
	defer svc.Close()
	m := svc.Workpool()
	var handled atomic.Int64
	m.Register("bench.noop", func(context.Context, workpool.Job) (json.RawMessage, error) {
		handled.Add(1)
		return nil, nil
	})
	m.RegisterHook("bench.hook", func(context.Context, pgx.Tx, workpool.Completion) error { return nil })
	r, err := start(ctx, svc)
	if err != nil {
		return err
	}
	defer r.stop()
	stopProfile, err := startCPUProfile(c.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()

	var single, fair []fairPhase
	for round := range c.Rounds {
		for i := range 2 {
			orgs := 1
			if (i+round)%2 == 1 {
				orgs = c.Orgs
			}
			ph, err := fairBurnDown(ctx, svc.DB(), m, c, orgs, &handled, r)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "pool: round %d orgs=%d burndown=%.0f jobs/s p99 start lag: worst org %s, best org %s\n",
				round+1, orgs, ph.rate, ph.worstP99.Round(time.Millisecond), ph.bestP99.Round(time.Millisecond))
			if orgs == 1 {
				single = append(single, ph)
			} else {
				fair = append(fair, ph)
			}
		}
	}
	s, f := medianPhase(single), medianPhase(fair)
	fmt.Printf("pool: n=%d parallelism=%d orgs=%d rounds=%d single-org burndown=%.0f jobs/s fair-share burndown=%.0f jobs/s (%.2f×) "+
		"worst org p99 start lag=%s (single org: %s)\n",
		c.N, c.Parallelism, c.Orgs, c.Rounds, s.rate, f.rate, fairRatio(single, fair), f.worstP99.Round(time.Millisecond), s.worstP99.Round(time.Millisecond))
	return nil
}

// fairBurnDown runs one burn-down of c.N items over orgs fresh orgs.
func fairBurnDown(ctx context.Context, db *pgxpool.Pool, m *workpool.Manager, c PoolConfig, orgs int,
	handled *atomic.Int64, r *running) (fairPhase, error) {
	if err := m.Pause(ctx, poolName); err != nil {
		return fairPhase{}, err
	}
	names := make([]string, orgs)
	run := uuid.NewString()[:8]
	for k := range names {
		names[k] = fmt.Sprintf("bench-%s-%02d", run, k)
	}
	params := make([]workpool.EnqueueParams, 0, c.Batch)
	for i := range c.N {
		// Org blocks: org k's items are the k-th n/orgs.
		org := names[min(i*orgs/c.N, orgs-1)]
		p := workpool.EnqueueParams{OrgID: org, Pool: poolName, Handler: "bench.noop", Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		if c.Hook {
			p.OnComplete = &workpool.OnComplete{Hook: "bench.hook", Context: json.RawMessage(`{}`)}
		}
		if params = append(params, p); len(params) == c.Batch || i == c.N-1 || names[min((i+1)*orgs/c.N, orgs-1)] != org {
			if _, err := m.EnqueueMany(ctx, params); err != nil {
				return fairPhase{}, fmt.Errorf("enqueue: %w", err)
			}
			params = params[:0]
		}
	}
	// Each burn-down from the same state: the dead rows and index entries
	// of the ones before it vacuumed away (else the later side of a pair
	// walks what the earlier left, and autovacuum, free to start in
	// either, takes its CPU), the statistics fresh, the dirty pages on
	// disk.
	for _, sql := range []string{"VACUUM (ANALYZE) workpool_work, workpool_org_queues", "CHECKPOINT"} {
		if _, err := db.Exec(ctx, sql); err != nil {
			fmt.Fprintf(os.Stderr, "pool: %s before the burn-down failed (%v): its pair is uneven\n", sql, err)
		}
	}
	target := handled.Load() + int64(c.N)
	resumed := time.Now()
	if err := m.Resume(ctx, poolName); err != nil {
		return fairPhase{}, err
	}
	if err := waitFinished(ctx, db, names, handled, target, r); err != nil {
		return fairPhase{}, err
	}
	ph := fairPhase{rate: float64(c.N) / time.Since(resumed).Seconds()}
	lags, err := orgStartLags(ctx, db, names, resumed)
	if err != nil {
		return fairPhase{}, err
	}
	ph.worstP99, ph.bestP99 = slices.Max(lags), slices.Min(lags)
	return ph, nil
}

// waitFinished waits until the handlers ran target items in all, then
// until none of the orgs' items is still running: each ran once (noop
// handlers never fail), so that is when every completion is committed.
// One read of the small running set per poll, whatever the number of orgs
// (a report per org would cost the many-org burn-down more than the
// single-org one, inside the timed span).
func waitFinished(ctx context.Context, db *pgxpool.Pool, orgs []string, handled *atomic.Int64, target int64, r *running) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.done:
			return fmt.Errorf("the service stopped during the burn-down: %v", r.err)
		case <-tick.C:
		}
		if handled.Load() < target {
			continue
		}
		var running bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workpool_work WHERE pool = $1 AND state = 'running' AND org_id = ANY($2))`,
			poolName, orgs).Scan(&running); err != nil {
			return fmt.Errorf("reading the running work: %w", err)
		}
		if !running {
			return nil
		}
	}
}

// orgStartLags reads each org's p99 start lag, counted from the resume (a
// benchmark's read across its own orgs).
func orgStartLags(ctx context.Context, db *pgxpool.Pool, orgs []string, resumed time.Time) ([]time.Duration, error) {
	rows, err := db.Query(ctx, `
		SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - greatest(run_at, $3)))
		FROM workpool_work WHERE pool = $1 AND org_id = ANY($2) GROUP BY org_id`, poolName, orgs, resumed)
	if err != nil {
		return nil, fmt.Errorf("reading start lags: %w", err)
	}
	secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		return nil, fmt.Errorf("reading start lags: %w", err)
	}
	if len(secs) != len(orgs) {
		return nil, errors.New("reading start lags: some org's work is missing")
	}
	out := make([]time.Duration, len(secs))
	for i, s := range secs {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out, nil
}

// fairRatio is the median, over the rounds, of each round's fair-share
// rate over its own single-org rate: only the two burn-downs of one round
// compare (single[i] and fair[i] ran in round i).
func fairRatio(single, fair []fairPhase) float64 {
	r := make([]float64, min(len(single), len(fair)))
	for i := range r {
		r[i] = fair[i].rate / single[i].rate
	}
	return median(r)
}

// medianPhase is the phase of median rate, its lags with it; of an even
// count, the mean of the two middle phases (rate and lags).
func medianPhase(ps []fairPhase) fairPhase {
	s := slices.Clone(ps)
	slices.SortFunc(s, func(a, b fairPhase) int {
		switch {
		case a.rate < b.rate:
			return -1
		case a.rate > b.rate:
			return 1
		}
		return 0
	})
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	// An even count: the mean of the two middle phases, as median() takes
	// (the upper one was the faster of the default two rounds).
	a, b := s[len(s)/2-1], s[len(s)/2]
	return fairPhase{rate: (a.rate + b.rate) / 2, worstP99: (a.worstP99 + b.worstP99) / 2, bestP99: (a.bestP99 + b.bestP99) / 2}
}

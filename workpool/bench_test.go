package workpool

// Benchmarks. testkit's server runs with fsync off; point
// REVEILLE_TEST_DATABASE_URL at a server with durable settings for numbers
// comparable with `engine bench pool` (docs/benchmarks.md).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/reveille/reveille/internal/testkit"
)

// benchMaxPending keeps the pending cap on (its counting is part of every
// enqueue) but out of reach: the enqueue benchmarks pile up far more
// unfinished work for their one org than the default cap allows.
const benchMaxPending = math.MaxInt32

func benchManager(b *testing.B, parallelism int, reg prometheus.Registerer) *Manager {
	b.Helper()
	return benchManagerWith(b, Config{Pools: map[string]int{"default": parallelism}, Registry: reg, MaxPendingPerOrg: benchMaxPending})
}

func benchManagerWith(tb testing.TB, cfg Config) *Manager {
	tb.Helper()
	db := testkit.NewPool(tb)
	cfg.Logger = testkit.Logger(tb)
	m, err := New(db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	m.RegisterHook("noop", func(context.Context, pgx.Tx, Completion) error { return nil })
	return m
}

func benchParams(n int) []EnqueueParams {
	ps := make([]EnqueueParams, n)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: "bench", Pool: "default", Handler: "noop", Args: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`),
			OnComplete: &OnComplete{Hook: "noop", Context: json.RawMessage(`{}`)}}
	}
	return ps
}

// BenchmarkEnqueue is one item per transaction.
func BenchmarkEnqueue(b *testing.B) {
	m := benchManager(b, 25, nil)
	p := benchParams(1)[0]
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Enqueue(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkEnqueueNoPendingCap is BenchmarkEnqueue with the pending cap
// off: the difference is what keeping the cap costs.
func BenchmarkEnqueueNoPendingCap(b *testing.B) {
	m := benchManagerWith(b, Config{Pools: map[string]int{"default": 25}, MaxPendingPerOrg: NoPendingLimit})
	p := benchParams(1)[0]
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Enqueue(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkEnqueueMany is batches of 1000 items per transaction.
func BenchmarkEnqueueMany(b *testing.B) {
	m := benchManager(b, 25, nil)
	ps := benchParams(1000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.EnqueueMany(ctx, ps); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(ps))/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkCancelAllBesideAnotherOrg: one org's 20,000 ready items are
// canceled at once (CancelAll, untimed, the pool paused), another org's one
// item waits beside them; timed from the resume until every cancelation is
// processed. other_org_ms is how long the other org's item waited to
// finish: the loop takes cancelations 100 an iteration.
func BenchmarkCancelAllBesideAnotherOrg(b *testing.B) {
	const backlog = 20_000
	for b.Loop() {
		b.StopTimer()
		m := benchManager(b, 5, nil)
		ctx := context.Background()
		if err := m.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Pause(ctx, "default"); err != nil {
			b.Fatal(err)
		}
		ps := make([]EnqueueParams, 1000)
		for i := range ps {
			ps[i] = EnqueueParams{OrgID: "org-a", Pool: "default", Handler: "noop"}
		}
		for range backlog / len(ps) {
			if _, err := m.EnqueueMany(ctx, ps); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := m.CancelAll(ctx, "org-a", "default", time.Now().Add(time.Minute)); err != nil {
			b.Fatal(err)
		}
		other, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-b", Pool: "default", Handler: "noop"})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := m.Resume(ctx, "default"); err != nil {
			b.Fatal(err)
		}
		var otherDone time.Duration
		for {
			if otherDone == 0 {
				if st, err := m.Status(ctx, "org-b", other); err == nil && st.State == StateFinished {
					otherDone = time.Since(t0)
				}
			}
			var left int
			if err := m.db.QueryRow(ctx, `SELECT count(*) FROM workpool_cancelations`).Scan(&left); err != nil {
				b.Fatal(err)
			}
			if left == 0 && otherDone != 0 {
				break
			}
			time.Sleep(time.Millisecond) // polling for the end of a benchmark, not synchronising a test
		}
		b.StopTimer()
		b.ReportMetric(float64(otherDone.Milliseconds()), "other_org_ms")
		if err := m.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkBurndown enqueues 10,000 no-op items with hooks (untimed), then
// times the pool (max_parallelism 100) working them all off until every
// completion is committed.
func BenchmarkBurndown(b *testing.B) {
	const n, parallelism = 10_000, 100
	for b.Loop() {
		b.StopTimer()
		reg := prometheus.NewRegistry()
		m := benchManager(b, parallelism, reg)
		var hooked atomic.Int64
		m.RegisterHook("noop", func(context.Context, pgx.Tx, Completion) error { hooked.Add(1); return nil })
		ctx := context.Background()
		ps := benchParams(n)
		for i := 0; i < n; i += 1000 {
			if _, err := m.EnqueueMany(ctx, ps[i:i+1000]); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		if err := m.Start(ctx); err != nil {
			b.Fatal(err)
		}
		for hooked.Load() < int64(n) {
			time.Sleep(time.Millisecond) // polling for the end of a benchmark, not synchronising a test
		}
		for {
			var finished int
			if err := m.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&finished); err != nil {
				b.Fatal(err)
			}
			if finished == n {
				break
			}
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(t0)
		b.StopTimer()
		_ = m.Stop(ctx)
		b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
		logHistograms(b, reg)
		b.StartTimer()
	}
}

// logHistograms prints count and mean of the batching histograms (-v).
func logHistograms(b *testing.B, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range mf.Metric {
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			b.Logf("%-45s count=%-6d mean=%.4g", mf.GetName(), h.GetSampleCount(), h.GetSampleSum()/float64(h.GetSampleCount()))
		}
	}
}

// BenchmarkStartStatement times one fast start statement on a frozen pool
// of 100 slots and 50,000 pending items (one org's, or 20 orgs' enqueued
// in org blocks as `engine bench pool` does), with 99 slots in use (a
// start of 1) or none (a start of 100): each run in a transaction rolled
// back, so that every run sees the same pool; the 20 orgs' turns stand
// where a burn-down leaves them (each org 100 or 101 starts charged, the
// clock at 100). The fair statement's cost beside the plain one's is what
// fair share costs the burn-down (docs/benchmarks.md § "Fair share").
// Besides the time per run it reports the database backend's CPU time per
// run (Linux: /proc), which a busy shared machine disturbs less.
func BenchmarkStartStatement(b *testing.B) {
	for _, orgs := range []int{1, 20} {
		for _, running := range []int{99, 0} {
			b.Run(fmt.Sprintf("orgs=%d/free=%d", orgs, 100-running), func(b *testing.B) {
				benchStartStatement(b, orgs, running)
			})
		}
	}
}

func benchStartStatement(b *testing.B, orgs, running int) {
	m := benchManager(b, 100, nil)
	ctx := context.Background()
	ps := benchParams(50_000)
	for i := range ps {
		ps[i].OrgID = fmt.Sprintf("org-%02d", i*orgs/len(ps))
	}
	// the oldest items of each org run, as after earlier starts
	l := frozenPool(b, m, ps, `
		UPDATE workpool_work w SET state = 'running', started_at = now() FROM (
		  SELECT id, row_number() OVER (ORDER BY rn, org_id) AS k FROM (
		    SELECT id, org_id, row_number() OVER (PARTITION BY org_id ORDER BY run_at, id) AS rn FROM workpool_work) x) r
		WHERE w.id = r.id AND r.k <= $1`, running)
	if orgs > 1 {
		l.turns = fairTurns{orgs: map[string]orgTurns{}, num: 100, den: 1}
		for k := range orgs {
			l.turns.orgs[fmt.Sprintf("org-%02d", k)] = orgTurns{served: int64(100 + k%2), weight: 1}
		}
	}
	conn, err := m.db.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	sql, shared := sqlIterateFast, false
	if orgs > 1 {
		sql, shared = sqlIterateFastNear, true
	}
	var (
		fenced, paused, plain, cancels, decided, keyed bool
		nextAt                                         *time.Time
		free                                           int32
		s                                              startedWork
		charges                                        turnCharges
	)
	args, dest := append(l.startArgs(time.Now()), l.gen), []any{&fenced, &paused, &plain, &cancels, &nextAt, &decided, &keyed, &free, new(bool)}
	if shared {
		args, dest = append(args, l.turns.args()...), append(dest, charges.dest()...)
	}
	dest = append(dest, s.dest()...)
	cpu0 := processCPU(pid)
	for b.Loop() {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
			b.Fatal(err)
		}
		if !fenced || len(s.lags) != 100-running {
			b.Fatalf("fenced %v, started %d of %d", fenced, len(s.lags), 100-running)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if cpu0 >= 0 {
		b.ReportMetric(float64(processCPU(pid)-cpu0)/float64(b.N), "pg-cpu-ns/op")
	}
}

// processCPU is the user and system CPU time process pid has used, in ns
// (-1 where /proc cannot tell).
func processCPU(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// the fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th of them, in clock ticks (100 a second on Linux)
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// BenchmarkFairStartAmongManyOrgs is the fair fast statement (the near
// pick) on a frozen pool of many orgs, each with a few ready items, half
// of them already served this round (a line in the ledger one start past
// the clock) and half tied at the clock, as midway through a round of a
// busy pool: a start of one free slot and of 100. Each run is rolled back.
func BenchmarkFairStartAmongManyOrgs(b *testing.B) {
	for _, orgs := range []int{20, 1000, 10_000} {
		for _, free := range []int{1, 100} {
			b.Run(fmt.Sprintf("orgs=%d/free=%d", orgs, free), func(b *testing.B) {
				benchFairStartAmongManyOrgs(b, orgs, free)
			})
		}
	}
}

func benchFairStartAmongManyOrgs(b *testing.B, orgs, free int) {
	m, args := manyOrgsPool(b, orgs, free)
	ctx := context.Background()
	conn, err := m.db.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var r fairRun
	dest := r.dest()
	for b.Loop() {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.QueryRow(ctx, sqlIterateFastNear, args...).Scan(dest...); err != nil {
			b.Fatal(err)
		}
		if !r.fenced || !r.decided || len(r.started.lags) != free {
			b.Fatalf("fenced %v, decided %v, started %d of %d", r.fenced, r.decided, len(r.started.lags), free)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// frozenPool enqueues ps into the default pool (1,000 a statement), runs
// running (SQL, with args) to mark the work that holds slots, analyzes
// the table as a busy system's would be, and returns the pool's loop,
// leading: the pool the start statement benchmarks run on, each run
// rolled back.
func frozenPool(tb testing.TB, m *Manager, ps []EnqueueParams, running string, args ...any) *loop {
	tb.Helper()
	ctx := context.Background()
	for i := 0; i < len(ps); i += 1000 {
		if _, err := m.EnqueueMany(ctx, ps[i:min(i+1000, len(ps))]); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := m.db.Exec(ctx, running, args...); err != nil {
		tb.Fatal(err)
	}
	if _, err := m.db.Exec(ctx, `VACUUM ANALYZE workpool_work`); err != nil {
		tb.Fatal(err)
	}
	l := newLoop(m, "default")
	if err := l.takeover(ctx); err != nil {
		tb.Fatal(err)
	}
	return l
}

// fairRun is what one fair fast statement returns, for the tests and
// benchmarks that run one by hand.
type fairRun struct {
	fenced, paused, plain, cancels, decided, keyed, unseen bool
	nextAt                                                 *time.Time
	free                                                   int32
	charges                                                turnCharges
	started                                                startedWork
}

// dest is the statement's result columns, in order.
func (r *fairRun) dest() []any {
	return append(append([]any{&r.fenced, &r.paused, &r.plain, &r.cancels, &r.nextAt, &r.decided, &r.keyed, &r.free, &r.unseen},
		r.charges.dest()...), r.started.dest()...)
}

// manyOrgsPool is a frozen pool of 100 slots, free of them free, and orgs
// orgs, each with a few ready items, half of them already served this
// round (a line in the ledger one start past the clock) and half tied at
// the clock, as midway through a round of a busy pool; with the arguments
// of its leading loop's fair fast statement.
func manyOrgsPool(tb testing.TB, orgs, free int) (*Manager, []any) {
	tb.Helper()
	m := benchManagerWith(tb, Config{Pools: map[string]int{"default": 100}, MaxPendingPerOrg: benchMaxPending})
	ps := benchParams(max(3, 400/orgs) * orgs)
	at := time.Now().Add(-time.Minute)
	for i := range ps {
		ps[i].OrgID = fmt.Sprintf("org-%05d", i%orgs)
		ps[i].RunAt = at.Add(time.Duration(i) * time.Microsecond)
	}
	// the slots not free hold items of the orgs served this round
	l := frozenPool(tb, m, ps, `
		UPDATE workpool_work w SET state = 'running', started_at = now() FROM (
		  SELECT id, row_number() OVER (ORDER BY run_at) AS k FROM workpool_work
		  WHERE org_id IN (SELECT org_id FROM workpool_work GROUP BY org_id ORDER BY org_id LIMIT $2)) r
		WHERE w.id = r.id AND r.k <= $1`, 100-free, orgs/2)
	l.turns = fairTurns{orgs: map[string]orgTurns{}, num: 100, den: 1}
	for k := range orgs / 2 {
		l.turns.orgs[fmt.Sprintf("org-%05d", k)] = orgTurns{served: 101, weight: 1}
	}
	return m, append(append(l.startArgs(time.Now()), l.gen), l.turns.args()...)
}

package workpool

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	testWait = 20 * time.Second
	testTick = 5 * time.Millisecond
)

// fakeClock is a settable clock for driving the loop by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().UTC().Truncate(time.Millisecond)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// harness drives one Manager's "default" pool by hand, as the reference
// suites drive main: no background goroutines, a fake clock.
type harness struct {
	t     *testing.T
	ctx   context.Context
	db    *pgxpool.Pool
	m     *Manager
	clock *fakeClock
	l     *loop
}

type harnessOpt func(*Config)

func withMaxParallelism(n int) harnessOpt {
	return func(c *Config) { c.Pools = map[string]int{"default": n} }
}

func newHarness(t *testing.T, opts ...harnessOpt) *harness {
	t.Helper()
	return newHarnessOn(t, testkit.NewPool(t), opts...)
}

// newHarnessOn is newHarness on db (a migrated database's pool).
func newHarnessOn(t *testing.T, db *pgxpool.Pool, opts ...harnessOpt) *harness {
	t.Helper()
	clock := newFakeClock()
	cfg := Config{
		Pools:  map[string]int{"default": 10},
		Logger: testkit.Logger(t),
		Now:    clock.Now,
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(db, cfg)
	require.NoError(t, err)
	m.Register("test_handle", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	h := &harness{t: t, ctx: context.Background(), db: db, m: m, clock: clock}
	h.l = newLoop(m, "default")
	require.NoError(t, h.l.takeover(h.ctx))
	return h
}

// runMain runs one iteration of the default pool's loop.
func (h *harness) runMain() iterResult {
	h.t.Helper()
	res, err := h.l.iterate(h.ctx)
	require.NoError(h.t, err)
	return res
}

// iterateHeldAtThePoolRow runs an iteration of the loop in the background
// while the test holds the pool row locked, and returns once the
// iteration, its snapshot taken, waits for that row (its fence, its first
// write); its result arrives on the channel once the test lets go.
func (h *harness) iterateHeldAtThePoolRow() <-chan iterResult {
	h.t.Helper()
	picked := make(chan iterResult, 1)
	go func() {
		res, err := h.l.iterate(h.ctx)
		assert.NoError(h.t, err)
		picked <- res
	}()
	require.Eventually(h.t, func() bool {
		var waiting bool
		err := h.db.QueryRow(h.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE workpool_pools%')`).Scan(&waiting)
		return assert.NoError(h.t, err) && waiting
	}, 10*time.Second, 5*time.Millisecond, "the iteration waits for the pool row after taking its snapshot")
	return picked
}

// iterateAround runs an iteration of the loop with during run while it
// is under way — its snapshot taken, before its first write (the test
// holds the pool row meanwhile) — and returns its result.
func (h *harness) iterateAround(during func()) iterResult {
	h.t.Helper()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(h.t, err)
	defer func() { _ = lock.Rollback(h.ctx) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM workpool_pools WHERE name = 'default' FOR UPDATE`)
	require.NoError(h.t, err)
	picked := h.iterateHeldAtThePoolRow()
	during()
	require.NoError(h.t, lock.Rollback(h.ctx))
	return <-picked
}

type workOpt func(*EnqueueParams)

func withRetry(max, backoffMS int, base float64) workOpt {
	return func(p *EnqueueParams) {
		p.Retry = &RetryPolicy{MaxAttempts: max, InitialBackoffMS: backoffMS, Base: base}
	}
}

func withRunAt(at time.Time) workOpt { return func(p *EnqueueParams) { p.RunAt = at } }

func withHook(name string, ctx string) workOpt {
	return func(p *EnqueueParams) { p.OnComplete = &OnComplete{Hook: name, Context: json.RawMessage(ctx)} }
}

func withOrg(org string) workOpt { return func(p *EnqueueParams) { p.OrgID = org } }

// enqueue adds a work item to the default pool of org-1.
func (h *harness) enqueue(opts ...workOpt) uuid.UUID {
	h.t.Helper()
	p := EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", Args: json.RawMessage(`{}`)}
	for _, o := range opts {
		o(&p)
	}
	id, err := h.m.Enqueue(h.ctx, p)
	require.NoError(h.t, err)
	return id
}

// complete reports one attempt's result as an executor would (attempt
// counts from 1; the reference's attempt 0 is our attempt 1).
func (h *harness) complete(id uuid.UUID, kind string, attempt int) []finishedRow {
	h.t.Helper()
	r := attemptResult{id: id, pool: "default", attempt: attempt, kind: kindFailed, retryable: true}
	switch kind {
	case "success":
		r.kind, r.result = kindSucceeded, json.RawMessage(`null`)
	case "failed":
		r.err = "boom"
	case "final":
		r.err, r.retryable = "boom", false
	default:
		h.t.Fatalf("unknown completion kind %q", kind)
	}
	var done []finishedRow
	err := pgx.BeginFunc(h.ctx, h.db, func(tx pgx.Tx) error {
		var err error
		done, err = h.m.completeTx(h.ctx, tx, []attemptResult{r})
		return err
	})
	require.NoError(h.t, err)
	h.m.countRecorded(done) // as the completer does after its commit
	return done
}

func (h *harness) cancel(id uuid.UUID) {
	h.t.Helper()
	require.NoError(h.t, h.m.Cancel(h.ctx, "org-1", id))
}

func (h *harness) status(id uuid.UUID) Status {
	h.t.Helper()
	s, err := h.m.Status(h.ctx, "org-1", id)
	require.NoError(h.t, err)
	return s
}

// observation is everything an outside observer of the pool can see: the
// reference's pendingStart, running (slots) and pendingCancelation tables,
// the loop's run status and generation. (The reference's pendingCompletion
// has no counterpart: recording an attempt frees its slot and decides the
// next state in one statement.)
type observation struct {
	pending            []uuid.UUID // waiting to start (the reference's pendingStart)
	running            []uuid.UUID // holding a slot: a running attempt
	pendingCancelation []uuid.UUID
	runStatus          RunStatus
	generation         int64
}

func (o observation) isPending(id uuid.UUID) bool { return contains(o.pending, id) }
func (o observation) isRunning(id uuid.UUID) bool { return contains(o.running, id) }
func (o observation) isCanceling(id uuid.UUID) bool {
	return contains(o.pendingCancelation, id)
}

func contains(ids []uuid.UUID, id uuid.UUID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (h *harness) observe() observation {
	h.t.Helper()
	var o observation
	ids := func(sql string, args ...any) []uuid.UUID {
		rows, err := h.db.Query(h.ctx, sql, args...)
		require.NoError(h.t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(h.t, err)
		return out
	}
	o.pending = ids(`SELECT id FROM workpool_work WHERE pool = 'default' AND state = 'pending' ORDER BY run_at`)
	o.running = ids(`SELECT id FROM workpool_work WHERE pool = 'default' AND state = 'running'`)
	o.pendingCancelation = ids(`SELECT work_id FROM workpool_cancelations WHERE pool = 'default'`)
	require.NoError(h.t, h.db.QueryRow(h.ctx, `SELECT run_kind, run_saturated, run_at, generation FROM workpool_pools WHERE name = 'default'`).
		Scan(&o.runStatus.Kind, &o.runStatus.Saturated, &o.runStatus.At, &o.generation))
	return o
}

// workRow is the raw row of a work item (the reference's work doc).
type workRow struct {
	state    string
	attempts int
	canceled bool
	outcome  *string
	hook     *string
}

func (h *harness) work(id uuid.UUID) workRow {
	h.t.Helper()
	var w workRow
	require.NoError(h.t, h.db.QueryRow(h.ctx,
		`SELECT state, attempts, canceled, outcome, hook_state FROM workpool_work WHERE id = $1`, id).
		Scan(&w.state, &w.attempts, &w.canceled, &w.outcome, &w.hook))
	return w
}

// exec runs SQL against the test database (to build states the public API
// cannot reach, as the reference suites do).
func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	_, err := h.db.Exec(h.ctx, sql, args...)
	require.NoError(h.t, err)
}

// onBothPaths runs test as parallel subtests "full" and "fast", each on a
// harness of its own (opts): the loop taking only the full iteration, or
// the fast one wherever it can.
func onBothPaths(t *testing.T, test func(t *testing.T, h *harness), opts ...harnessOpt) {
	for _, full := range []bool{true, false} {
		t.Run(map[bool]string{true: "full", false: "fast"}[full], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, opts...)
			h.l.fullOnly = full
			test(t, h)
		})
	}
}

// raisePeak raises peak to n when n is higher (for handlers that track the
// most attempts running at once).
func raisePeak(peak *atomic.Int64, n int64) {
	for {
		p := peak.Load()
		if n <= p || peak.CompareAndSwap(p, n) {
			return
		}
	}
}

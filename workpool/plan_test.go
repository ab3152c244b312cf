package workpool

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// plannedOutcome is what one planned start did (tryPlannedPick).
type plannedOutcome struct {
	held    bool // the view held (the statement's verdict)
	short   bool // an org had less ready work than its read could take
	free    int
	started []uuid.UUID
	turns   map[string]int64
	clock   [2]int64
}

// enqueueEach enqueues n items for each of orgs, in turn.
func (h *harness) enqueueEach(n int, orgs ...string) {
	h.t.Helper()
	for range n {
		for _, org := range orgs {
			h.enqueue(withOrg(org))
		}
	}
}

// completeHandingOver records each of ids a success and hands each
// batch to the loop, as the completer would.
func (h *harness) completeHandingOver(ids ...uuid.UUID) {
	h.t.Helper()
	for _, id := range ids {
		h.l.noteCompleted(completedBatches(h.complete(id, "success", 1))["default"])
	}
}

// completeRunning is completeHandingOver of everything running.
func (h *harness) completeRunning() {
	h.t.Helper()
	h.completeHandingOver(h.observe().running...)
}

// mustReadView reads a view of the default pool now: there must be one.
func (h *harness) mustReadView() *fairView {
	h.t.Helper()
	v, err := h.l.readView(h.ctx, h.clock.Now())
	require.NoError(h.t, err)
	require.NotNil(h.t, v)
	return v
}

// tryPlannedPick reads a view of the default pool, plans from it and the
// loop's turns, and runs the planned start in a transaction it rolls
// back; nil when the pool cannot plan (fewer than two orgs with ready
// work, keyed work ready, a per-org cap).
func (h *harness) tryPlannedPick() *plannedOutcome {
	h.t.Helper()
	now := h.clock.Now()
	v, err := h.l.readView(h.ctx, now)
	require.NoError(h.t, err)
	if v == nil {
		return nil
	}
	return h.runPlannedIn(v, now)
}

func (h *harness) runPlannedIn(v *fairView, now time.Time) *plannedOutcome {
	h.t.Helper()
	tx, err := h.db.Begin(h.ctx)
	require.NoError(h.t, err)
	defer func() { _ = tx.Rollback(h.ctx) }()
	var (
		out plannedOutcome
		r   plannedRun
	)
	p, err := v.readAhead(h.ctx, tx, h.l.pool, now, &h.l.turns, time.Minute)
	require.NoError(h.t, err)
	args, sent := v.args(h.l, now, p)
	require.NoError(h.t, tx.QueryRow(h.ctx, sqlIterateFastPlanned, args...).Scan(r.dest()...))
	require.True(h.t, r.fenced)
	out.held, out.short, out.free = r.ok, sent < p.total(), int(r.free)
	rows, err := tx.Query(h.ctx, `SELECT id FROM workpool_work WHERE pool = 'default' AND state = 'running' AND started_at = $1 ORDER BY id`, now)
	require.NoError(h.t, err)
	out.started, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(h.t, err)
	require.Len(h.t, r.pickedOrgs, len(out.started))
	after := fairTurns{orgs: maps.Clone(h.l.turns.orgs), num: h.l.turns.num, den: h.l.turns.den}
	after.apply(p.charges(r.pickedOrgs))
	out.turns = map[string]int64{}
	for org, o := range after.orgs {
		out.turns[org] = o.served
	}
	out.clock = [2]int64{after.num, after.den}
	return &out
}

// A planned start starts what the full fair pick starts and charges what
// it charges, whenever its view holds: both run on the same random pools
// — weights, running work, items not yet due, queue heads gone stale,
// turns charged at the current weight or at another, a clock set — with
// no per-org cap (a pool with one does not plan). Where an org has less
// ready work than the full pick's bound assumed, the full pick leaves
// slots free (the loop fills them at its next start); the planned start,
// which reads each org ahead and so knows, fills them at once with the
// next in the same order: the full pick's items and more.
func TestPlannedStart_StartsWhatTheFullFairPickStarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rng := rand.New(rand.NewPCG(36, 2026))
	same, part, skipped := 0, 0, 0
	for round := range 300 {
		h.l.turns = fairTurns{}
		charged := round%2 == 1
		if charged {
			h.l.turns.num, h.l.turns.den = int64(rng.IntN(40)), int64(1+rng.IntN(4))
		}
		h.randomFairPool(rng, charged, 1+rng.IntN(12), nil, 9, true)
		planned := h.tryPlannedPick()
		if planned == nil {
			skipped++
			continue
		}
		full := h.tryFairPick(sqlIterateFastShared)
		require.True(t, full.decided, "round %d", round)
		require.True(t, planned.held, "round %d: a view read just now holds", round)
		if len(full.started) < planned.free && len(planned.started) > len(full.started) {
			// (the full pick's bound left slots free, an org running
			// short: the planned start, which knows what each org has
			// left, fills them with the next in the same order)
			part++
			require.Subset(t, planned.started, full.started, "round %d: the full pick's part of the planned start", round)
			continue
		}
		same++
		require.Equal(t, full.started, planned.started, "round %d: the same items start", round)
		require.Equal(t, full.turns, planned.turns, "round %d: the same turns charged", round)
		require.Equal(t, full.clock[0]*planned.clock[1], planned.clock[0]*full.clock[1], "round %d: the same clock: %v, %v",
			round, full.clock, planned.clock)
	}
	require.Greater(t, same, 100, "most rounds plan the whole pick")
	require.Positive(t, part, "some rounds read an org short")
	t.Logf("planned the whole pick in %d rounds, a part in %d; %d rounds could not plan", same, part, skipped)
}

// A view counts each recorded batch once: one committed before the view
// was read is in it already, even when it is handed over after the read;
// one committed after is taken off the slots it counts. The planned start
// on it then holds.
func TestPlannedView_CountsEachRecordedBatchOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(6))
	h.enqueueEach(6, "a", "b")
	h.runMain()
	require.Equal(t, map[string]int{"a": 3, "b": 3}, h.runningByOrg())
	runningOf := func(org string) uuid.UUID {
		var id uuid.UUID
		require.NoError(t, h.db.QueryRow(h.ctx, `SELECT id FROM workpool_work WHERE state = 'running' AND org_id = $1 LIMIT 1`, org).Scan(&id))
		return id
	}
	h.clock.Advance(time.Millisecond) // (the planned start's items: those started now)
	before := h.complete(runningOf("a"), "success", 1)
	v := h.mustReadView()
	after1 := h.complete(runningOf("b"), "success", 1)
	after2 := h.complete(runningOf("b"), "success", 1)

	h.l.noteCompleted(completedBatches(after1)["default"])
	h.l.noteCompleted(completedBatches(before)["default"]) // handed over after the read, and out of order
	h.l.noteCompleted(completedBatches(after2)["default"])
	h.l.foldCompleted(v)

	require.Equal(t, map[string]int64{"a": 2, "b": 1}, v.running)
	out := h.runPlannedIn(v, h.clock.Now())
	require.True(t, out.held, "the view holds")
	require.Len(t, out.started, 3, "the slots the three completions freed")
}

// A view is only as good as what it saw: a completion it was not handed
// (another replica's, say), an enqueue for an org it does not know, a
// setting changed, keyed work — each makes the planned statement start
// nothing. (The loop recounts the first from the statement's snapshot
// and plans again: TestPlannedStart_CompletionsNotYetHandedOverAreRecountedNotMissed;
// for the others the near pick decides.)
func TestPlannedView_AChangeItDidNotSeeMakesThePlannedStartStartNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *harness, running []uuid.UUID)
	}{
		{"a completion not handed over", func(h *harness, running []uuid.UUID) { h.complete(running[0], "success", 1) }},
		{"work of an org it does not know", func(h *harness, _ []uuid.UUID) { h.enqueue(withOrg("c")) }},
		{"a weight changed", func(h *harness, _ []uuid.UUID) { require.NoError(h.t, h.m.SetOrgWeight(h.ctx, "default", "a", 2)) }},
		{"keyed work ready", func(h *harness, _ []uuid.UUID) { h.enqueue(withOrg("a"), withKey("k", 1)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(4))
			h.enqueueEach(6, "a", "b")
			h.runMain()
			running := h.observe().running
			h.clock.Advance(time.Millisecond) // (the planned start's items: those started now)
			h.complete(running[1], "success", 1)
			h.complete(running[2], "success", 1)
			v := h.mustReadView()
			require.True(t, h.runPlannedIn(v, h.clock.Now()).held, "unchanged, the view holds")

			tc.change(h, running)
			out := h.runPlannedIn(v, h.clock.Now())
			require.False(t, out.held)
			require.Empty(t, out.started)
		})
	}
}

// On a running pool, a burn-down of several orgs' backlog starts from the
// loop's planned view, every item once, the orgs taking turns; an org
// whose work arrives midway makes a planned start miss, and its work
// starts at the next start all the same.
func TestPlannedStart_ABurnDownOfSeveralOrgsStartsFromTheViewEachItemOnce(t *testing.T) {
	t.Parallel()
	const perOrg, par = 60, 4
	db := testkit.NewPool(t)
	m, err := New(db, liveConfig(t, Config{Pools: map[string]int{"default": par}, RecoveryPeriod: time.Minute}))
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		order   []string
		midway  = make(chan struct{})
		lateAt  = -1
		lateOrg = "d"
	)
	m.Register("rec", func(_ context.Context, j Job) (json.RawMessage, error) {
		mu.Lock()
		order = append(order, j.OrgID)
		if len(order) == perOrg {
			close(midway)
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		return nil, nil
	})
	ctx := context.Background()
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() { stopManager(t, m) })
	require.NoError(t, m.Pause(ctx, "default"))
	for _, org := range []string{"a", "b", "c"} {
		ps := make([]EnqueueParams, perOrg)
		for i := range ps {
			ps[i] = EnqueueParams{OrgID: org, Pool: "default", Handler: "rec"}
		}
		_, err := m.EnqueueMany(ctx, ps)
		require.NoError(t, err)
	}
	require.NoError(t, m.Resume(ctx, "default"))
	<-midway
	mu.Lock()
	lateAt = len(order)
	mu.Unlock()
	ps := make([]EnqueueParams, 10)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: lateOrg, Pool: "default", Handler: "rec"}
	}
	_, err = m.EnqueueMany(ctx, ps)
	require.NoError(t, err)

	total := 3*perOrg + len(ps)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&n))
		return n == total
	}, testWait, testTick)
	var once bool
	require.NoError(t, db.QueryRow(ctx, `SELECT bool_and(attempts = 1 AND outcome = 'succeeded') FROM workpool_work`).Scan(&once))
	require.True(t, once, "every item ran once and succeeded")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, order, total)
	counts := map[string]int{}
	for i, org := range order[:perOrg] {
		counts[org]++
		lo, hi := perOrg, 0
		for _, o := range []string{"a", "b", "c"} {
			lo, hi = min(lo, counts[o]), max(hi, counts[o])
		}
		require.LessOrEqual(t, hi-lo, 2*par, "the orgs take turns (after %d starts: %v)", i+1, counts)
	}
	first := slices.Index(order, lateOrg)
	require.Less(t, first-lateAt, 4*par, "the late org's work starts at once (enqueued after %d starts, first started %d)", lateAt, first)
	require.Positive(t, testutil.ToFloat64(m.metrics.fairPlans.WithLabelValues("default", "held")), "planned starts held")
}

// Dropping a view moves the queue heads its planned starts went past —
// the near and full picks read each org from its head — but not the head
// of a queue someone wrote since the view was read (an enqueue may have
// added work before where the view read from).
func TestPlannedView_DroppedMovesTheHeadsItsStartsWentPastOfQueuesNoOneWrote(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	for range 6 {
		h.enqueue(withOrg("a"))
		h.enqueue(withOrg("b"))
		h.clock.Advance(time.Millisecond) // each item its own run_at
	}
	before := h.queueHeads()
	v := h.mustReadView()
	h.l.view = v
	res, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.True(t, res.didWork)
	h.clock.Advance(time.Millisecond)
	for _, id := range h.observe().running {
		h.complete(id, "success", 1)
	}
	h.l.view.running = map[string]int64{} // (as the completer would hand them over)
	res, decided, err = h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.True(t, res.didWork)
	require.Equal(t, before, h.queueHeads(), "planned starts leave the queues alone")

	h.enqueue(withOrg("b"), withRunAt(h.clock.Now().Add(time.Hour))) // b's queue written since the view
	h.l.dropView(h.ctx)

	after := h.queueHeads()
	var firstPending time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT min(run_at) FROM workpool_work WHERE org_id = 'a' AND state = 'pending'`).Scan(&firstPending))
	require.True(t, after["a"].After(before["a"]), "a's head moved past its started items")
	require.False(t, after["a"].After(firstPending.UTC()), "never past a's first pending item")
	require.Equal(t, before["b"], after["b"], "b's queue was written since the view: its head stays")
	require.Nil(t, h.l.view)
}

// A planned start that finds only the slots held changed — completions
// committed but not yet handed over to the loop — takes them from its
// snapshot and starts at once: recounted, not missed, the view kept.
func TestPlannedStart_CompletionsNotYetHandedOverAreRecountedNotMissed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	h.enqueueEach(6, "a", "b")
	v := h.mustReadView()
	h.l.view = v
	_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	running := h.observe().running
	require.Len(t, running, 4)
	h.complete(running[0], "success", 1) // (never handed over)
	h.complete(running[1], "success", 1)

	res, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.True(t, res.didWork)
	require.Len(t, h.observe().running, 4, "the two freed slots filled")
	require.NotNil(t, h.l.view, "the view kept")
	require.Equal(t, 1.0, testutil.ToFloat64(h.m.metrics.fairPlans.WithLabelValues("default", "recounted")))
	require.Zero(t, testutil.ToFloat64(h.m.metrics.fairPlans.WithLabelValues("default", "missed")))
}

// Dropping a view does not wait for a queue row another transaction holds
// (an enqueue not yet committed, a record holding a retry's row through
// its hooks): that row's head stays where it was; the others move, and
// the queue of an org whose work has all started goes.
func TestPlannedView_DroppedSkipsAQueueRowAnotherTransactionHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	for i := range 4 {
		if i < 2 {
			h.enqueue(withOrg("a"))
		}
		h.enqueue(withOrg("b"))
		h.clock.Advance(time.Millisecond) // each item its own run_at
	}
	v := h.mustReadView()
	h.l.view = v
	for range 2 { // a1+b1, then a2+b2 (the second moves both heads)
		res, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
		require.NoError(t, err)
		require.True(t, decided)
		require.True(t, res.didWork)
		require.NotNil(t, h.l.view)
		h.clock.Advance(time.Millisecond)
		for _, id := range h.observe().running {
			h.complete(id, "success", 1)
		}
		h.l.view.running = map[string]int64{} // (as the completer would hand them over)
	}
	before := h.queueHeads()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM workpool_org_queues WHERE pool = 'default' AND org_id = 'b' FOR UPDATE`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { // a has nothing left (off the view), b3 starts; then the view goes
		_, _, err := h.l.runPlanned(h.ctx, h.clock.Now())
		h.l.dropView(h.ctx)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testWait):
		_ = lock.Rollback(h.ctx)
		<-done
		t.Fatal("the planned start waited for another transaction's lock of b's queue row")
	}
	after := h.queueHeads()
	require.NotContains(t, after, "a", "a's queue, with nothing pending, went")
	require.Equal(t, before["b"], after["b"], "b's row, held, is left as it was")
}

// queryCounter counts, and may fail, one statement on the pool's
// connections (a pgx tracer).
type queryCounter struct {
	sql  string
	fail bool
	n    atomic.Int64
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL != c.sql {
		return ctx
	}
	c.n.Add(1)
	if c.fail { // (as a statement timeout)
		ctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		cancel()
		return ctx
	}
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// burnDownCounting runs a started Manager whose connections carry c over
// a burn-down of orgs × perOrg items in a pool of par slots (perOrgCap:
// nil for none) and stops it.
func burnDownCounting(t *testing.T, c *queryCounter, orgs, perOrg, par int, perOrgCap *int) *Manager {
	t.Helper()
	return burnDownTraced(t, c, time.Minute, orgs, perOrg, par, perOrgCap)
}

// burnDownTraced is burnDownCounting with any tracer, and a recovery due
// every recovery.
func burnDownTraced(t *testing.T, tracer pgx.QueryTracer, recovery time.Duration, orgs, perOrg, par int, perOrgCap *int) *Manager {
	t.Helper()
	cfg := testkit.NewPool(t).Config()
	cfg.ConnConfig.Tracer = tracer
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	m, err := New(db, liveConfig(t, Config{Pools: map[string]int{"default": par}, RecoveryPeriod: recovery}))
	require.NoError(t, err)
	m.Register("rec", func(context.Context, Job) (json.RawMessage, error) { time.Sleep(2 * time.Millisecond); return nil, nil })
	ctx := context.Background()
	if perOrgCap != nil {
		require.NoError(t, m.SetMaxParallelismPerOrg(ctx, "default", perOrgCap))
	}
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() { stopManager(t, m) })
	require.NoError(t, m.Pause(ctx, "default"))
	for o := range orgs {
		ps := make([]EnqueueParams, perOrg)
		for i := range ps {
			ps[i] = EnqueueParams{OrgID: fmt.Sprintf("org%d", o), Pool: "default", Handler: "rec"}
		}
		_, err := m.EnqueueMany(ctx, ps)
		require.NoError(t, err)
	}
	require.NoError(t, m.Resume(ctx, "default"))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE state <> 'finished'`).Scan(&n))
		return n == 0
	}, testWait, testTick)
	stopManager(t, m)
	return m
}

// A pool that cannot plan — here for its per-org cap — or whose view
// cannot be read asks for a view less and less often, as after missed
// plans: not after every fair start.
func TestPlannedView_APoolThatCannotPlanAsksForAViewLessAndLessOften(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      bool
		perOrgCap *int
	}{
		{name: "a per-org cap", perOrgCap: ptr(2)},
		{name: "the view cannot be read", fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &queryCounter{sql: sqlFairView, fail: tc.fail}
			m := burnDownCounting(t, c, 3, 40, 4, tc.perOrgCap)
			require.Zero(t, testutil.ToFloat64(m.metrics.fairPlans.WithLabelValues("default", "held")), "nothing planned")
			require.LessOrEqual(t, c.n.Load(), int64(8), "views asked for over %d fair starts", m.loopFor("default").fastStarts)
		})
	}
}

// The backoff between views grows only with misses: a view of a pool
// with one org's ready work is no miss, a plan that held but found no
// slot to fill does not end it, a plan that started work does, and so
// does the pool going idle (a new backlog gets a fresh start). A pool
// with a per-org cap cannot plan at all.
func TestPlannedView_TheBackoffGrowsOnlyWithMissesAndEndsWithAPlannedStartOrIdle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	h.enqueue(withOrg("a"))
	v, err := h.l.readView(h.ctx, h.clock.Now())
	require.NoError(t, err, "one org's ready work is no miss")
	require.Nil(t, v)

	h.enqueueEach(3, "a", "b")
	h.runMain() // both slots taken
	v = h.mustReadView()
	h.l.view, h.l.planMisses = v, 3
	res, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.False(t, res.didWork)
	require.Equal(t, 3, h.l.planMisses, "a plan that held but started nothing proves little")

	h.clock.Advance(time.Millisecond)
	h.complete(h.observe().running[0], "success", 1)
	res, decided, err = h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.True(t, res.didWork)
	require.Zero(t, h.l.planMisses, "a planned start ends the backoff")

	h.l.planMisses, h.l.planWait = 5, 31
	h.exec(`UPDATE workpool_work SET state = 'finished', outcome = 'succeeded', finished_at = now() WHERE state <> 'finished'`)
	h.exec(`DELETE FROM workpool_org_queues`)
	h.clock.Advance(time.Hour)
	require.Equal(t, "idle", h.runMain().status.Kind)
	require.Zero(t, h.l.planMisses, "an idle pool starts afresh")
	require.Zero(t, h.l.planWait)

	require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", ptr(1)))
	h.enqueueEach(2, "a", "b")
	_, err = h.l.readView(h.ctx, h.clock.Now())
	require.ErrorIs(t, err, errCannotPlan)
}

// Small bursts of several orgs' work, each burnt down to its last item by
// the near pick, leave no backoff behind: a later backlog of several orgs
// is planned from its first fair starts.
func TestPlannedView_SmallBurstsLeaveTheNextBacklogFreeToPlan(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 4}, RecoveryPeriod: time.Minute})
	m.Register("rec", func(context.Context, Job) (json.RawMessage, error) { time.Sleep(2 * time.Millisecond); return nil, nil })
	ctx := context.Background()
	total := 0
	finished := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&n))
			return n == total
		}, testWait, testTick)
	}
	enqueue := func(n int, orgs ...string) {
		t.Helper()
		var ps []EnqueueParams
		for _, org := range orgs {
			for range n {
				ps = append(ps, EnqueueParams{OrgID: org, Pool: "default", Handler: "rec"})
			}
		}
		_, err := m.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		total += len(ps)
	}
	for range 40 {
		enqueue(3, "x", "y")
		finished()
	}
	heldBefore := testutil.ToFloat64(m.metrics.fairPlans.WithLabelValues("default", "held"))

	require.NoError(t, m.Pause(ctx, "default"))
	enqueue(60, "a", "b", "c")
	require.NoError(t, m.Resume(ctx, "default"))
	finished()
	require.Greater(t, testutil.ToFloat64(m.metrics.fairPlans.WithLabelValues("default", "held")), heldBefore+10,
		"the backlog of three orgs was planned")
}

// plannedBesideFull works out what the full fair pick would start now
// (rolled back), then runs the planned start, which must hold (start n of
// the caller's), and returns both sets of ids: what the full pick started
// and what the planned start did, in id order.
func (h *harness) plannedBesideFull(n int) (full pickOutcome, started []uuid.UUID) {
	h.t.Helper()
	full = h.tryFairPick(sqlIterateFastShared)
	_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(h.t, err)
	require.True(h.t, decided, "start %d: the view holds", n)
	rows, err := h.db.Query(h.ctx, `SELECT id FROM workpool_work WHERE state = 'running' AND started_at = $1 ORDER BY id`, h.clock.Now())
	require.NoError(h.t, err)
	started, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(h.t, err)
	return full, started
}

// A view kept over many planned starts — each reading from what the last
// read ahead, completions handed over between them — starts at each the
// items the full fair pick would start then, and charges its turns, as
// the orgs run out of work one after another, to the last item.
func TestPlannedStart_AViewKeptOverManyStartsStartsWhatTheFullPickStartsEachTime(t *testing.T) {
	for seed := range 4 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(5))
			rng := rand.New(rand.NewPCG(uint64(seed), 37))
			orgs := []string{"a", "b", "c", "d"}[:2+rng.IntN(3)]
			for _, org := range orgs {
				if w := 1 + rng.IntN(3); w > 1 {
					require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", org, w))
				}
			}
			for range 60 + rng.IntN(60) {
				h.enqueue(withOrg(orgs[rng.IntN(len(orgs))]))
				h.clock.Advance(time.Millisecond) // (each its own run_at: one run_at's items start in either order)
			}
			h.runMain()
			h.l.view = h.mustReadView()
			planned := 0
			for h.l.view != nil {
				running := h.observe().running
				if len(running) == 0 {
					break
				}
				done := 1 + rng.IntN(len(running))
				h.completeHandingOver(running[:done]...)
				free := 5 - (len(running) - done)
				h.clock.Advance(time.Millisecond) // (this start's items: those started now)
				full, started := h.plannedBesideFull(planned)
				if len(full.started) < free && len(started) > len(full.started) {
					// (the full pick's bound left slots free: as in
					// TestPlannedStart_StartsWhatTheFullFairPickStarts)
					require.Subset(t, started, full.started, "start %d: the full pick's part of the planned start", planned)
					planned++
					continue
				}
				require.Equal(t, full.started, started, "start %d: the same items start", planned)
				for org, served := range full.turns {
					require.Equal(t, served, h.l.turns.orgs[org].served, "start %d: org %s charged the same", planned, org)
				}
				planned++
			}
			require.NotNil(t, h.l.view, "the view held to the end")
			require.Empty(t, h.observe().pending, "every item started")
			require.Greater(t, planned, 5, "the view held over many starts")
			t.Logf("%d planned starts on one view", planned)
		})
	}
}

// The planned starts read each org ahead for several starts: a burn-down
// of many orgs reads ahead far less often than it starts.
func TestPlannedStart_ReadsAheadForSeveralStarts(t *testing.T) {
	t.Parallel()
	c := &queryCounter{sql: sqlReadAhead}
	m := burnDownCounting(t, c, 6, 120, 12, nil)
	held := testutil.ToFloat64(m.metrics.fairPlans.WithLabelValues("default", "held"))
	require.Greater(t, held, 20.0, "planned starts held")
	require.Positive(t, c.n.Load(), "read ahead")
	require.Less(t, float64(c.n.Load()), held/3, "reads ahead over %v planned starts", held)
	t.Logf("%d reads ahead over %v planned starts", c.n.Load(), held)
}

// A planned start finds its items by their tuples, and starts a tuple
// only as the item it read ahead there: one holding another item (here a
// read-ahead made to disagree) stays pending, and the view goes.
func TestPlannedStart_StartsATupleOnlyAsTheItemReadAheadThere(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	h.enqueueEach(10, "a", "b")
	h.runMain()
	h.l.view = h.mustReadView()
	h.completeRunning()
	_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	require.NotNil(t, h.l.view, "the view holds")
	h.completeRunning()
	a := h.l.view.orgs["a"]
	require.NotEmpty(t, a.ahead, "a read ahead")
	wrong := a.ahead[0].id
	a.ahead[0].id = uuid.New()

	h.clock.Advance(time.Millisecond)
	_, decided, err = h.l.runPlanned(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.True(t, decided)
	var state string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT state FROM workpool_work WHERE id = $1`, wrong).Scan(&state))
	require.Equal(t, "pending", state, "the tuple's item is not the one read ahead there")
	require.Nil(t, h.l.view, "a planned item that did not start drops the view")
	require.Len(t, h.observe().running, 3, "the other planned items started")
}

// An org whose ready work has all started leaves the view, which then
// lasts until that org's next item comes due; dropping the view moves the
// org's queue head to that item.
func TestPlannedView_AnOrgWhoseReadyWorkAllStartedLeavesTheViewUntilItsNextItemComesDue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	later := h.clock.Now().Add(time.Hour)
	h.enqueue(withOrg("a"), withRunAt(later))
	h.enqueueEach(2, "a")
	h.enqueueEach(5, "b")
	h.runMain() // a1 and b1
	h.l.view = h.mustReadView()
	for range 2 { // a2 and b2, then b3 and b4: a has nothing ready
		h.completeRunning()
		h.clock.Advance(time.Millisecond)
		_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now())
		require.NoError(t, err)
		require.True(t, decided)
	}
	v := h.l.view
	require.NotNil(t, v, "the view holds")
	require.NotContains(t, v.orgs, "a", "a, with nothing ready, is off the view")
	require.True(t, v.until.Equal(later), "the view lasts until a's next item comes due: %v", v.until)
	h.l.dropView(h.ctx)
	require.True(t, h.queueHeads()["a"].Equal(later), "a's queue head moved to its next item")
}

// An org that a read ahead finds with less ready work than it asked for
// holds the view only until its next item comes due — even while some of
// its ready work is still to start (the plan knows only what it read).
func TestPlannedView_AnExhaustedOrgHoldsTheViewOnlyUntilItsNextItemComesDue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	later := h.clock.Now().Add(time.Hour)
	h.enqueue(withOrg("a"), withRunAt(later))
	h.enqueueEach(4, "a", "b")
	h.enqueueEach(6, "b")
	h.runMain() // a1 and b1
	h.l.view = h.mustReadView()
	h.completeRunning()
	h.clock.Advance(time.Millisecond)
	_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now()) // a2 and b2; a's read ahead: a3, a4
	require.NoError(t, err)
	require.True(t, decided)
	v := h.l.view
	require.NotNil(t, v)
	require.Contains(t, v.orgs, "a", "a has ready work left")
	require.True(t, v.orgs["a"].exhausted, "a's read ahead found all its ready work")
	require.True(t, v.until.Equal(later), "the view lasts until a's next item comes due: %v", v.until)
}

// A planned item that another transaction holds is passed over, and the
// view goes: its org's queue head stays at or before it, so that the next
// picks, which read the org from its head, start it.
func TestPlannedStart_AnItemALockHeldBackIsStartedByTheNextPicks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	var a1 uuid.UUID
	for i := range 2 {
		if id := h.enqueue(withOrg("a")); i == 0 {
			a1 = id
		}
		h.clock.Advance(time.Millisecond)
	}
	for range 6 {
		h.enqueue(withOrg("b"))
		h.clock.Advance(time.Millisecond)
	}
	h.l.view = h.mustReadView()
	lock, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(h.ctx, `SELECT 1 FROM workpool_work WHERE id = $1 FOR UPDATE`, a1)
	require.NoError(t, err)
	_, decided, err := h.l.runPlanned(h.ctx, h.clock.Now()) // a1, a2, b1, b2 planned: a1 passed over
	require.NoError(t, err)
	require.True(t, decided)
	require.NoError(t, lock.Rollback(h.ctx))
	require.Nil(t, h.l.view, "a planned item not started drops the view")
	require.Positive(t, h.l.planWait, "and the next view waits out a backoff (a lock held long would drop each at once)")
	var runAt time.Time
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1 AND state = 'pending'`, a1).Scan(&runAt))
	require.False(t, h.queueHeads()["a"].After(runAt.UTC()), "a's queue head is at or before its pending a1")

	for range 10 {
		for _, id := range h.observe().running {
			h.complete(id, "success", 1)
		}
		h.clock.Advance(time.Millisecond)
		h.runMain()
	}
	var state string
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT state FROM workpool_work WHERE id = $1`, a1).Scan(&state))
	require.NotEqual(t, "pending", state, "a1 started")
}

// A read ahead that fails is a read that failed, as a view's: the near
// pick decides, views are asked for less and less often, and the loop
// keeps its pool (it does not stand down).
func TestPlannedStart_AFailingReadAheadFallsBackToTheNearPick(t *testing.T) {
	t.Parallel()
	c := &queryCounter{sql: sqlReadAhead, fail: true}
	m := burnDownCounting(t, c, 3, 40, 4, nil)
	require.Zero(t, errorsAt(m, stageLoop), "the loop never stood down")
	require.Positive(t, c.n.Load(), "reads ahead tried")
	require.LessOrEqual(t, c.n.Load(), int64(8), "reads ahead tried over %d fair starts", m.loopFor("default").fastStarts)
}

// A queue not yet due when the view was read ends the view when it comes
// due (the planned start checks the due queues): the view is dropped
// then, not missed.
func TestPlannedView_AQueueComingDueEndsTheViewWithoutAMiss(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	later := h.clock.Now().Add(time.Minute)
	h.enqueue(withOrg("a"), withRunAt(later))
	h.enqueueEach(20, "b", "c")
	h.runMain()
	h.l.view = h.mustReadView()
	require.True(t, h.l.view.until.Equal(later), "the view lasts until a's queue comes due: %v", h.l.view.until)
	h.completeRunning()
	h.clock.Advance(time.Minute)
	_, err := h.l.iterateFast(h.ctx, h.clock.Now())
	require.NoError(t, err)
	require.Zero(t, testutil.ToFloat64(h.m.metrics.fairPlans.WithLabelValues("default", "missed")), "no miss")
	require.Zero(t, h.l.planMisses)
}

// The loop orders the planned items itself, and the fair order ends with
// the org id in its column's collation: where orgs tie on their turn,
// their slots held and their item's run_at, a planned start gives the
// last free slot to the org the full pick gives it to, whether the
// collation sorts org ids by their bytes or not (ICU's root collation
// puts "a" before "B", bytes put it after).
func TestPlannedStart_BreaksTiesBetweenOrgsByTheirIdsInTheColumnsCollation(t *testing.T) {
	for _, collation := range []string{"", "und-x-icu"} {
		t.Run("collation="+cmp.Or(collation, "default"), func(t *testing.T) {
			t.Parallel()
			db := testkit.NewPool(t)
			if collation != "" {
				rows, err := db.Query(context.Background(), `SELECT table_name FROM information_schema.columns
					WHERE table_schema = current_schema() AND column_name = 'org_id' AND table_name LIKE 'workpool%'`)
				require.NoError(t, err)
				tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				require.NotEmpty(t, tables)
				for _, table := range tables {
					_, err := db.Exec(context.Background(), fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN org_id TYPE text COLLATE %q`,
						pgx.Identifier{table}.Sanitize(), collation))
					require.NoError(t, err, "table %s", table)
				}
			}
			h := newHarnessOn(t, db, withMaxParallelism(3))
			orgs := []string{"a", "B", "c", "D"}
			for range 12 {
				for _, org := range orgs {
					h.enqueue(withOrg(org)) // (the orgs' k-th items share a run_at)
				}
				h.clock.Advance(time.Millisecond)
			}
			h.runMain()
			h.l.view = h.mustReadView()
			planned := 0
			for h.l.view != nil && planned < 12 {
				running := h.observe().running
				h.completeHandingOver(running...)
				h.clock.Advance(time.Millisecond)
				full, started := h.plannedBesideFull(planned)
				require.Len(t, full.started, 3, "start %d: the full pick fills the slots", planned)
				require.Equal(t, full.started, started, "start %d: the same items start", planned)
				planned++
			}
			require.Equal(t, 12, planned, "the view held")
		})
	}
}

// A full iteration drops the planned view (it may cancel, recover and
// start what the view does not know), but a view that held is read again
// at the next fair start, before it picks: the backlog goes on planned,
// with no near or full pick between (each planned anew in a fresh
// connection's cache: 15–40 ms in the pool bench). Here a recovery comes
// due every 20 ms of a burn-down.
func TestPlannedView_AViewAFullIterationDroppedIsReadAgainAtTheNextFairStart(t *testing.T) {
	t.Parallel()
	c := &statementCounter{names: map[string]string{sqlCensus: "full", sqlIterateFastNear: "near",
		sqlIterateFastShared: "shared", sqlFairView: "view", sqlIterateFastPlanned: "planned"}}
	burnDownTraced(t, c, 20*time.Millisecond, 3, 150, 4, nil)
	n := c.counts()
	t.Logf("statements: %v", n)
	require.GreaterOrEqual(t, n["full"], int64(8), "full iterations in the burn-down")
	require.Positive(t, n["planned"], "planned starts")
	// (a few remain: a miss's backoff, a start racing a completion; each
	// drop would take one without the read)
	require.LessOrEqual(t, n["near"]+n["shared"], n["full"]/4, "fair picks besides the planned starts")
}

// A dropped view is read again only for the backlog it planned: a pool
// that goes idle forgets it.
func TestPlannedView_APoolGoingIdleForgetsADroppedView(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.l.reread = true
	h.runMain() // (the term's first iteration is full: nothing to do)
	require.False(t, h.l.reread)
}

// statementCounter counts the statements of names (SQL → name) the pool's
// connections run, alone or in batches.
type statementCounter struct {
	names map[string]string
	mu    sync.Mutex
	n     map[string]int64
}

func (c *statementCounter) count(sql string) {
	if name, ok := c.names[sql]; ok {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int64{}
		}
		c.n[name]++
		c.mu.Unlock()
	}
}

func (c *statementCounter) counts() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

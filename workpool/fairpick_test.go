package workpool

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// pickOutcome is what one fair fast statement did: the items it started,
// the org queues' heads after it, whether it decided the pick, and the
// loop's turns (starts charged to each org) and the pool's clock
// (num, den) had it committed.
type pickOutcome struct {
	started []uuid.UUID
	heads   map[string]time.Time
	decided bool
	turns   map[string]int64
	clock   [2]int64
}

// tryFairPick runs one fair fast statement on the default pool, with the
// loop's turns, in a transaction it rolls back, and reads what it did;
// the loop's turns stay as they were.
func (h *harness) tryFairPick(sql string) pickOutcome {
	h.t.Helper()
	tx, err := h.db.Begin(h.ctx)
	require.NoError(h.t, err)
	defer func() { _ = tx.Rollback(h.ctx) }()
	now := h.clock.Now()
	var (
		r   fairRun
		out pickOutcome
	)
	err = tx.QueryRow(h.ctx, sql, append(append(h.l.startArgs(now), h.l.gen), h.l.turns.args()...)...).Scan(r.dest()...)
	require.NoError(h.t, err)
	require.True(h.t, r.fenced)
	out.decided = r.decided
	rows, err := tx.Query(h.ctx, `SELECT id FROM workpool_work WHERE pool = 'default' AND state = 'running' AND started_at = $1 ORDER BY id`, now)
	require.NoError(h.t, err)
	out.started, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(h.t, err)
	rows, err = tx.Query(h.ctx, `SELECT org_id, head_at FROM workpool_org_queues WHERE pool = 'default'`)
	require.NoError(h.t, err)
	out.heads = map[string]time.Time{}
	var (
		org string
		at  time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&org, &at}, func() error { out.heads[org] = at.UTC(); return nil })
	require.NoError(h.t, err)
	after := fairTurns{orgs: maps.Clone(h.l.turns.orgs), num: h.l.turns.num, den: h.l.turns.den}
	after.apply(r.charges)
	out.turns = map[string]int64{}
	for org, o := range after.orgs {
		out.turns[org] = o.served
	}
	out.clock = [2]int64{after.num, after.den}
	return out
}

// The near pick (sqlIterateFastNear) makes the full fair pick's choice
// whenever it decides, and writes nothing but the fence when it does not:
// both statements run on the same random pools — weights, a per-org cap,
// running work, items not yet due, queue heads gone stale, in half of the
// rounds turns already charged and a clock set — and must start the same
// items, leave the same heads, charge the same turns and move the clock to
// the same turn; the full pick's starts and charges are also checked
// against its other way alone, reading every org (sqlEveryOrgPick), since
// both statements share the near way. (Every run_at differs: within an
// org, items of one run_at may start in either order; between orgs the
// org id breaks ties.)
func TestFairPick_TheNearPickStartsWhatTheFullPickStartsOrDefersToIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rng := rand.New(rand.NewPCG(13, 2026))
	decided, deferred, starts := 0, 0, 0
	for round := range 300 {
		h.l.turns = fairTurns{}
		charged := round%2 == 1
		if charged {
			h.l.turns.num, h.l.turns.den = int64(rng.IntN(40)), int64(1+rng.IntN(4))
		}
		maxPar := 1 + rng.IntN(10)
		if round%3 == 0 { // fewer slots than orgs: the near pick reads some of them
			maxPar = 1 + rng.IntN(3)
		}
		var perOrg *int32
		if rng.IntN(3) == 0 {
			perOrg = ptr(int32(1 + rng.IntN(4)))
		}
		h.randomFairPool(rng, charged, maxPar, perOrg, 7, round%3 != 0)
		near, full, every := h.tryFairPick(sqlIterateFastNear), h.tryFairPick(sqlIterateFastShared), h.tryFairPick(sqlEveryOrgPick)
		require.True(t, full.decided, "round %d", round)
		// (both fair statements share the near way: the full pick's starts
		// are also checked against its other way alone)
		require.Equal(t, every.started, full.started, "round %d: the full pick starts what reading every org starts", round)
		require.Equal(t, every.turns, full.turns, "round %d: the full pick charges what reading every org charges", round)
		if !near.decided {
			deferred++
			require.Empty(t, near.started, "round %d: an undecided near pick starts nothing", round)
			before := h.queueHeads()
			require.Equal(t, before, near.heads, "round %d: an undecided near pick moves no head", round)
			continue
		}
		decided++
		if len(near.started) > 0 {
			starts++
		}
		require.Equal(t, full.started, near.started, "round %d: the same items start", round)
		require.Equal(t, full.heads, near.heads, "round %d: the same heads remain", round)
		require.Equal(t, full.turns, near.turns, "round %d: the same turns charged", round)
		require.Equal(t, full.clock[0]*near.clock[1], near.clock[0]*full.clock[1], "round %d: the same clock: %v, %v", round, full.clock, near.clock)
	}
	require.Greater(t, decided, 50, "most rounds are decided by the near pick")
	require.Greater(t, starts, 50, "most decided rounds start work")
	require.Positive(t, deferred, "some rounds need the full pick")
	t.Logf("near pick decided %d rounds (%d of them started work), deferred %d", decided, starts, deferred)
}

// randomFairPool empties the default pool and fills it with a random
// fair-share state for the fair picks' comparisons: maxPar slots, the
// per-org cap perOrg (nil: none), up to 8 orgs, some weighted, each with
// up to maxItems-1 items at their own run_at (some not yet due), some of
// them started (when mayRun) or finished since, the heads lagging behind;
// when charged, turns charged to most orgs (some at a weight since
// changed) — the loop's clock the caller set.
func (h *harness) randomFairPool(rng *rand.Rand, charged bool, maxPar int, perOrg *int32, maxItems int, mayRun bool) {
	h.t.Helper()
	h.exec(`DELETE FROM workpool_work`)
	h.exec(`DELETE FROM workpool_org_queues`)
	h.exec(`DELETE FROM workpool_org_weights`)
	h.exec(`DELETE FROM workpool_org_pending`)
	h.exec(`UPDATE workpool_pools SET max_parallelism = $1, max_parallelism_per_org = $2 WHERE name = 'default'`, maxPar, perOrg)
	now := h.clock.Now()
	tick := 0
	for o := range 1 + rng.IntN(8) {
		org := fmt.Sprintf("org-%d", o)
		weight := int32(1)
		if rng.IntN(3) == 0 {
			weight = int32(2 + rng.IntN(3))
			h.exec(`INSERT INTO workpool_org_weights (pool, org_id, weight) VALUES ('default', $1, $2)`, org, weight)
		}
		if charged && rng.IntN(4) != 0 {
			if rng.IntN(5) == 0 {
				weight++ // charged at a weight since changed: restarted
			}
			if h.l.turns.orgs == nil {
				h.l.turns.orgs = map[string]orgTurns{}
			}
			h.l.turns.orgs[org] = orgTurns{served: int64(rng.IntN(60)), weight: weight}
		}
		var params []EnqueueParams
		for range rng.IntN(maxItems) {
			tick++
			// the orgs' items interleave, each at its own run_at
			at := now.Add(-time.Duration(rng.IntN(50)*1000+tick) * time.Microsecond)
			if rng.IntN(6) == 0 {
				at = now.Add(time.Duration(tick) * time.Millisecond) // not yet due
			}
			params = append(params, EnqueueParams{OrgID: org, Pool: "default", Handler: "test_handle", RunAt: at})
		}
		if len(params) == 0 {
			continue
		}
		ids, err := h.m.EnqueueMany(h.ctx, params)
		require.NoError(h.t, err)
		for _, id := range ids {
			switch k := rng.IntN(6); {
			case k < 2 && mayRun: // started by an earlier pick: the head lags behind it
				h.exec(`UPDATE workpool_work SET state = 'running', started_at = $2 WHERE id = $1`, id, now.Add(-time.Second))
			case k < 3: // started and finished since: the head lags, no slot held
				h.exec(`UPDATE workpool_work SET state = 'finished', outcome = 'succeeded', started_at = $2, finished_at = $2 WHERE id = $1`,
					id, now.Add(-time.Second))
			}
		}
	}
}

// sqlEveryOrgPick is sqlIterateFastShared without its near way: it probes
// every queued org, the reference both ways of the fair pick must agree
// with.
var sqlEveryOrgPick = func() string {
	const near = "SELECT (SELECT org_id FROM keys LIMIT 1) IS NULL AND NOT EXISTS"
	if strings.Count(sqlIterateFastShared, near) != 1 {
		panic("sqlEveryOrgPick: the near way's condition is not where it was")
	}
	return strings.Replace(sqlIterateFastShared, near, "SELECT false AND NOT EXISTS", 1)
}()

// The near pick reads only the free slots' worth of orgs whose next start
// comes first, placed by their queues' heads. A head gone stale (the
// org's oldest items started or finished since the last pick moved it)
// places its org earlier than its first item: here org a, tied on its
// turn with org b, seems to come first, but its first ready item is newer
// than b's. b's item starts, whichever pick decides.
func TestFairPick_AStaleHeadNeverStartsAnOrgOutOfTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	now := h.clock.Now()
	a1 := h.enqueue(withOrg("a"), withRunAt(now.Add(-3*time.Millisecond)))
	b1 := h.enqueue(withOrg("b"), withRunAt(now.Add(-2*time.Millisecond)))
	h.enqueue(withOrg("a"), withRunAt(now.Add(-1*time.Millisecond)))
	h.exec(`UPDATE workpool_work SET state = 'finished', outcome = 'succeeded', finished_at = $2 WHERE id = $1`, a1, now)

	if near := h.tryFairPick(sqlIterateFastNear); near.decided {
		require.Equal(t, []uuid.UUID{b1}, near.started, "the oldest item of the orgs tied on their turn starts")
	} else {
		require.Empty(t, near.started)
	}
	full := h.tryFairPick(sqlIterateFastShared)
	require.True(t, full.decided)
	require.Equal(t, []uuid.UUID{b1}, full.started, "the oldest item of the orgs tied on their turn starts")
}

// Among many orgs tied on their turn, a start of one free slot reads one
// org's queue, not every tied org's: the near pick orders the orgs by
// their queues' heads first (before, a start of one slot read the 250 of
// 500 orgs tied at the lowest turn; ~32 ms a start at 1,000 orgs,
// docs/benchmarks.md § pool).
func TestFairPick_AStartAmongManyTiedOrgsReadsOnlyTheOrgsItCanStart(t *testing.T) {
	t.Parallel()
	for _, free := range []int{1, 10} {
		m, args := manyOrgsPool(t, 500, free)
		tx, err := m.db.Begin(context.Background())
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		var r fairRun
		require.NoError(t, tx.QueryRow(context.Background(), sqlIterateFastNear, args...).Scan(r.dest()...))
		var probes int
		require.NoError(t, tx.QueryRow(context.Background(),
			`SELECT pg_stat_get_xact_numscans('workpool_work_pending'::regclass)`).Scan(&probes))
		require.NoError(t, tx.Rollback(context.Background()))
		require.True(t, r.decided)
		require.Len(t, r.started.lags, free)
		require.LessOrEqual(t, probes, free, "a start of %d read %d orgs' queues", free, probes)
	}
}

// Keyed work that appears while the loop starts fairly on the near pick is
// started by the full pick in the same iteration, within its key's limit;
// the loop stays on the full pick while keyed work waits, and goes back to
// the near one once none does.
func TestFairPick_KeyedWorkHandsTheLoopToTheFullPickAndBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	a1 := h.enqueue(withOrg("a"))
	b1 := h.enqueue(withOrg("b"))
	h.runMain()
	require.True(t, h.l.shared, "two orgs' work: the loop starts fairly")
	require.False(t, h.l.keyed)

	h.clock.Advance(time.Millisecond)
	k1 := h.enqueue(withOrg("a"), withKey("k", 1))
	h.clock.Advance(time.Millisecond)
	k2 := h.enqueue(withOrg("a"), withKey("k", 1))
	a2 := h.enqueue(withOrg("a"))
	starts := h.l.fastStarts
	h.runMain()
	o := h.observe()
	require.Equal(t, starts+1, h.l.fastStarts, "started on the fast path")
	require.True(t, o.isRunning(k1) && o.isRunning(a2), "the full pick started the keyed and the plain work")
	require.True(t, o.isPending(k2), "within the key's limit")
	require.True(t, h.l.keyed, "keyed work waits: the next fast iteration takes the full pick")

	for _, id := range []uuid.UUID{a1, b1, k1} {
		h.complete(id, "success", 1)
	}
	h.runMain()
	require.True(t, h.observe().isRunning(k2))
	h.clock.Advance(time.Millisecond)
	b2 := h.enqueue(withOrg("b"))
	h.runMain()
	require.True(t, h.observe().isRunning(b2))
	require.False(t, h.l.keyed, "no keyed work waits any more: back to the near pick")
}

// The full iteration decides on the plain start from a census taken in an
// earlier statement of its transaction; work of another org that commits
// in between must not be started first come, first served. The plain
// start takes the census again and, seeing a second org's work (or keyed
// work), starts nothing and says so — the iteration then starts fairly.
func TestPlainStart_TakesNothingWhenASecondOrgsWorkIsReady(t *testing.T) {
	for _, tc := range []struct {
		name   string
		work   []workOpt
		wantOK bool
	}{
		{"one org's work: it starts", []workOpt{withOrg("a"), withOrg("a")}, true},
		{"a second org's work: it starts nothing", []workOpt{withOrg("a"), withOrg("b")}, false},
		{"keyed work: it starts nothing", []workOpt{withOrg("a"), withKey("k", 1)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			for _, o := range tc.work {
				h.enqueue(o)
			}
			tx, err := h.db.Begin(h.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(h.ctx) }()
			var (
				ok bool
				s  startedWork
			)
			err = tx.QueryRow(h.ctx, sqlStartPlain, append(h.l.startArgs(h.clock.Now()), int32(10))...).Scan(append([]any{&ok}, s.dest()...)...)
			require.NoError(t, err)

			require.Equal(t, tc.wantOK, ok)
			if tc.wantOK {
				require.Len(t, s.lags, len(tc.work))
			} else {
				require.Empty(t, s.lags)
			}
		})
	}
}

// The pool's weights are one CTE each queued org's weight is found in.
// Set for many orgs (a PATCH of the pool's weights) and not yet analyzed,
// as until autovacuum gets to the table, the near pick's plan must still
// find each org's weight once, not compare every queued org with every
// weight: a start among 2,000 orgs, 500 of them weighted, reads the
// weights once.
func TestFairPick_ManyWeightsAreNotComparedWithEveryQueuedOrg(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const orgs, weighted = 2000, 500
	m, args := manyOrgsPool(t, orgs, 1)
	_, err := m.db.Exec(ctx, `ALTER TABLE workpool_org_weights SET (autovacuum_enabled = false)`) // not yet analyzed
	require.NoError(t, err)
	w := 2
	weights := map[string]*int{}
	for k := range weighted {
		weights[fmt.Sprintf("org-%05d", orgs-1-k)] = &w
	}
	require.NoError(t, m.UpdatePool(ctx, "default", PoolUpdate{OrgWeights: weights}))

	// past five executions: the generic plan, as the loop runs it
	plan := testkit.PlanAfterRolledBack(t, m.db, sqlIterateFastNear, [][]any{args, args, args, args, args, args}, args)
	read := 0
	for _, line := range plan {
		if i := strings.Index(line, "loops="); i >= 0 && strings.Contains(line, "CTE Scan on weights") {
			var loops int
			_, err := fmt.Sscanf(line[i:], "loops=%d)", &loops)
			require.NoError(t, err)
			require.Equal(t, 1, loops, "the weights were read again for every queued org:\n%s", strings.Join(plan, "\n"))
			read++
		}
	}
	require.Positive(t, read, "the plan reads the weights:\n%s", strings.Join(plan, "\n"))
}

// A pick that moves many queue heads — every near org's, as when items
// have their own run_at and each start takes an org's first — finds each
// row it moves by its tuple id. Joined with the moves by org, the generic
// plan could run every queue row of the pool against every move, three
// times (lock, raise, drop): at 2,000 orgs and 100 moves, ~125 ms of a
// start in a burn-down. Here the planner is left no index to find the rows
// by org (a plan it may take on its own estimates), and the moves must
// still cost in proportion to themselves, not to the orgs.
func TestFairPick_MovingManyHeadsMeetsEachQueueRowOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const orgs, moves = 2000, 100
	m, args := manyOrgsPool(t, orgs, moves)
	// every head a microsecond behind its org's first item: each near org's
	// moves (and the first org left out still comes after them)
	_, err := m.db.Exec(ctx, `UPDATE workpool_org_queues SET head_at = head_at - interval '1 microsecond'`)
	require.NoError(t, err)
	var dbname string
	require.NoError(t, m.db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname))
	for _, off := range []string{"enable_indexscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin"} {
		_, err := m.db.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q SET %s = off`, dbname, off))
		require.NoError(t, err)
	}
	m.db.Reset() // new sessions, with those settings

	plan := testkit.PlanAfterRolledBack(t, m.db, sqlIterateFastNear, [][]any{args, args, args, args, args, args}, args)
	require.Contains(t, strings.Join(plan, "\n"), "Update on workpool_org_queues", "the heads move")
	met := 0
	for _, line := range plan {
		// a queue row or a move read again in a loop
		if !strings.Contains(line, "on workpool_org_queues") && !strings.Contains(line, "CTE Scan on moved") &&
			!strings.Contains(line, "CTE Scan on untouched") {
			continue
		}
		if m := loopedRows.FindStringSubmatch(line); m != nil {
			rows, _ := strconv.Atoi(m[1])
			loops, _ := strconv.Atoi(m[2])
			if loops > 1 {
				met += rows * loops
			}
		}
	}
	require.LessOrEqual(t, met, 3*moves, "%d moves among %d orgs met %d rows:\n%s", moves, orgs, met, strings.Join(plan, "\n"))
}

// Three free slots; org-1 (weight 2, far behind in turns) has two ready
// items, org-0 has three. The near orgs are org-1, org-0 and org-2; their
// share bound gives org-1 all three slots and org-0 none, but org-1 has
// only two items: the near pick decides, starts two, and leaves a slot
// free while org-0's work is ready — reading every org starts three.
func TestFairPick_ADecidedNearPickFillsTheSlotsReadingEveryOrgFills(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(3))
	now := h.clock.Now()
	for _, d := range []time.Duration{44, 37, 30} {
		h.enqueue(withOrg("org-0"), withRunAt(now.Add(-d*time.Millisecond)))
	}
	h.enqueue(withOrg("org-1"), withRunAt(now.Add(-12*time.Millisecond)))
	h.enqueue(withOrg("org-1"), withRunAt(now.Add(-11*time.Millisecond)))
	h.enqueue(withOrg("org-2"), withRunAt(now.Add(-13*time.Millisecond)))
	h.enqueue(withOrg("org-3"), withRunAt(now.Add(-31*time.Millisecond)))
	h.exec(`INSERT INTO workpool_org_weights (pool, org_id, weight) VALUES ('default', 'org-1', 2)`)
	h.l.turns = fairTurns{orgs: map[string]orgTurns{
		"org-0": {served: 20, weight: 1}, "org-2": {served: 27, weight: 1}, "org-3": {served: 47, weight: 1},
	}, num: 2, den: 1}

	every := h.tryFairPick(sqlEveryOrgPick)
	require.Len(t, every.started, 3, "reading every org fills the three free slots")
	near := h.tryFairPick(sqlIterateFastNear)
	if near.decided {
		require.Equal(t, every.started, near.started, "a decided near pick starts what reading every org starts")
	}
}

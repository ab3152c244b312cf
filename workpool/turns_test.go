package workpool

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// twoOrgsInOneSlot gives a pool of one slot two items each of orgs a and
// b, a's queued first.
func twoOrgsInOneSlot(t *testing.T) (*harness, []uuid.UUID) {
	h := newHarness(t, withMaxParallelism(1))
	var ids []uuid.UUID
	for _, org := range []string{"a", "a", "b", "b"} {
		ids = append(ids, h.enqueue(withOrg(org)))
		h.clock.Advance(time.Millisecond)
	}
	return h, ids
}

// The turns a term charged are saved when it ends and read by the next
// term, so that the next start after a change of leader is the other
// org's: without them both orgs would stand at turn 0 again, and a, queued
// first, would take the slot twice in a row.
func TestFairTurns_TheNextTermContinuesTheTurnsTheLastOneCharged(t *testing.T) {
	t.Parallel()
	h, ids := twoOrgsInOneSlot(t)
	h.runMain()
	require.Equal(t, map[string]int{"a": 1}, h.runningByOrg(), "a queued first and takes the first turn")
	require.Equal(t, orgTurns{served: 1, weight: 1}, h.l.turns.orgs["a"])
	h.complete(ids[0], "success", 1)
	require.NoError(t, h.l.saveTurns(h.ctx, time.Time{}), "the term's end saves")

	next := newLoop(h.m, "default")
	require.NoError(t, next.takeover(h.ctx))
	require.Equal(t, h.l.turns.orgs, next.turns.orgs, "the next term reads what the last one saved")
	require.Equal(t, [2]int64{h.l.turns.num, max(h.l.turns.den, 1)}, [2]int64{next.turns.num, next.turns.den})
	h.l = next
	h.runMain()

	require.Equal(t, map[string]int{"b": 1}, h.runningByOrg(), "b's turn, after the change of leader too")
}

// A loop deposed since its last iteration saves nothing: the ledger is
// the leader's alone.
func TestFairTurns_ADeposedLoopSavesNothing(t *testing.T) {
	t.Parallel()
	h, _ := twoOrgsInOneSlot(t)
	h.runMain()
	require.NotEmpty(t, h.l.turns.orgs)
	require.NoError(t, newLoop(h.m, "default").takeover(h.ctx))

	err := h.l.saveTurns(h.ctx, time.Time{})

	require.ErrorIs(t, err, errGenerationMismatch)
	var lines int
	require.NoError(t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM workpool_org_turns`).Scan(&lines))
	require.Zero(t, lines)
	require.True(t, h.l.turns.dirty, "still unsaved")
}

// A leader saves a changed ledger at most every turnsSaveEvery, and not at
// all while nothing changed.
func TestFairTurns_SavedAtMostEverySecondWhileTheyChange(t *testing.T) {
	t.Parallel()
	h, _ := twoOrgsInOneSlot(t)
	lines := func() int {
		var n int
		require.NoError(t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM workpool_org_turns`).Scan(&n))
		return n
	}
	require.NoError(t, h.l.saveTurns(h.ctx, h.clock.Now()), "nothing charged: nothing to save")
	h.runMain()
	require.NoError(t, h.l.saveTurns(h.ctx, h.clock.Now()))
	require.Zero(t, lines(), "less than a second since the term read the turns")

	h.clock.Advance(turnsSaveEvery)
	require.NoError(t, h.l.saveTurns(h.ctx, h.clock.Now()))
	require.Equal(t, 1, lines())
	require.False(t, h.l.turns.dirty)
}

// A leader whose pool goes quiet with charges unsaved still saves them
// within turnsSaveEvery: the loop would otherwise sleep until the next
// kick with them in memory alone, and a crash would lose them.
func TestFairTurns_AQuietLoopSavesItsChargesWithinASecond(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 1}})
	// (into the paused pool: the loop sees both orgs' work at once when it
	// resumes, and starts fairly, charging turns; seen one by one, each
	// would start alone on the plain path, which charges nothing)
	ctx := context.Background()
	require.NoError(t, m.Pause(ctx, "default"))
	ids, err := m.EnqueueMany(ctx, []EnqueueParams{{OrgID: "a", Pool: "default", Handler: "noop"}, {OrgID: "b", Pool: "default", Handler: "noop"}})
	require.NoError(t, err)
	require.NoError(t, m.Resume(ctx, "default"))
	for i, org := range []string{"a", "b"} {
		requireFinished(t, m, org, ids[i], OutcomeSucceeded)
	}
	requireLoopSettled(t, db, m, "default", "idle")

	require.Eventually(t, func() bool {
		var n int
		return db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_fair_clocks WHERE pool = 'default'`).Scan(&n) == nil && n == 1
	}, testWait, testTick, "the quiet loop never saved its turns")
}

// A line of the ledger counts only at the weight it was charged at: an
// org whose weight changed since restarts at the pool's current turn —
// also when the line was saved after the change, by a loop that had not
// seen it.
func TestFairTurns_ALineChargedAtAnotherWeightRestartsTheOrg(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lineAt    int32
		wantFirst string
	}{
		{"charged at the current weight: a is 5 starts ahead, b goes first", 3, "b"},
		{"charged at another weight: a restarts at turn 0, where its weight of 3 wins the tie", 1, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, _ := twoOrgsInOneSlot(t)
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "a", 3))
			h.l.turns = fairTurns{orgs: map[string]orgTurns{"a": {served: 5, weight: tc.lineAt}}, den: 1, dirty: true}
			h.clock.Advance(turnsSaveEvery)
			require.NoError(t, h.l.saveTurns(h.ctx, h.clock.Now()))
			require.NoError(t, h.l.takeover(h.ctx), "a new term reads the saved line")

			h.runMain()

			require.Equal(t, map[string]int{tc.wantFirst: 1}, h.runningByOrg())
		})
	}
}

// A ledger whose lines were all pruned (every org at or behind the clock)
// still has its clock, and the next term reads it back: picks after a
// change of leader are the picks the last term would have made.
func TestFairTurns_ASavedClockIsReadBackWithoutLines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "b", 3))
	org := map[uuid.UUID]string{}
	for _, o := range []string{"a", "a", "b", "b"} {
		org[h.enqueue(withOrg(o))] = o
		h.clock.Advance(time.Millisecond)
	}
	orgsOf := func(p pickOutcome) []string {
		var out []string
		for _, id := range p.started {
			out = append(out, org[id])
		}
		return out
	}
	h.l.turns = fairTurns{orgs: map[string]orgTurns{"a": {served: 1, weight: 1}}, num: 5, den: 3, dirty: true}
	before := h.tryFairPick(sqlIterateFastShared)
	require.Equal(t, []string{"b", "b"}, orgsOf(before))
	require.NoError(t, h.l.saveTurns(h.ctx, time.Time{}))
	require.Empty(t, h.l.turns.orgs, "a's line is at the clock: pruned")

	next := newLoop(h.m, "default")
	require.NoError(t, next.takeover(h.ctx))
	h.l = next

	require.Equal(t, [2]int64{5, 3}, [2]int64{next.turns.num, next.turns.den}, "the saved clock is read back")
	require.Equal(t, orgsOf(before), orgsOf(h.tryFairPick(sqlIterateFastShared)))
}

// A save in flight when another replica takes the pool over holds the
// pool row: the takeover waits for it and reads what it saved, rather
// than read the ledger without it while the save commits after.
func TestFairTurns_ATakeoverWaitsForASaveInFlightAndReadsIt(t *testing.T) {
	t.Parallel()
	h, _ := twoOrgsInOneSlot(t)
	h.runMain()
	require.Contains(t, h.l.turns.orgs, "a")
	// an uncommitted line for a holds the save up after it took its fence
	blocker, err := h.db.Begin(h.ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(h.ctx) }()
	_, err = blocker.Exec(h.ctx, `INSERT INTO workpool_org_turns (pool, org_id, served, weight) VALUES ('default', 'a', 0, 1)`)
	require.NoError(t, err)
	saved := make(chan error, 1)
	go func() { saved <- h.l.saveTurns(context.Background(), time.Time{}) }()
	h.waitForLockWaiters(1)

	next := newLoop(h.m, "default")
	took := make(chan error, 1)
	go func() { took <- next.takeover(context.Background()) }()
	h.waitForLockWaiters(2) // the takeover waits for the save's fence
	require.NoError(t, blocker.Rollback(h.ctx))

	require.NoError(t, <-saved)
	require.NoError(t, <-took)
	require.Equal(t, h.l.turns.orgs, next.turns.orgs, "the takeover read what the save wrote")
}

// waitForLockWaiters waits until n statements of the test's database wait
// on a lock.
func (h *harness) waitForLockWaiters(n int) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		var k int
		require.NoError(h.t, h.db.QueryRow(h.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&k))
		return k >= n
	}, testWait, testTick, "%d statements never waited on a lock", n)
}

func TestFairTurns_PruneDropsOnlyTheLinesTheClockLifts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		num, den int64
		line     orgTurns
		kept     bool
	}{
		{"ahead of the clock", 2, 1, orgTurns{served: 3, weight: 1}, true},
		{"at the clock", 2, 1, orgTurns{served: 2, weight: 1}, false},
		{"behind the clock", 2, 1, orgTurns{served: 1, weight: 1}, false},
		{"at weight 3, the clock's 2/1 is 6 starts", 2, 1, orgTurns{served: 6, weight: 3}, false},
		{"at weight 3, one start past it", 2, 1, orgTurns{served: 7, weight: 3}, true},
		{"a clock of 5/3 rounds up to 2 starts at weight 1", 5, 3, orgTurns{served: 2, weight: 1}, false},
		{"before the first start (den 0 reads as 1)", 0, 0, orgTurns{served: 1, weight: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turns := fairTurns{orgs: map[string]orgTurns{"o": tc.line}, num: tc.num, den: tc.den}
			turns.prune()
			_, kept := turns.orgs["o"]
			require.Equal(t, tc.kept, kept)
		})
	}
}

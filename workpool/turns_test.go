package workpool

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// startedOf is the work running in the default pool, by org.
func (h *harness) startedOf() map[string]int {
	h.t.Helper()
	rows, err := h.db.Query(h.ctx, `SELECT org_id, count(*) FROM workpool_work WHERE pool = 'default' AND state = 'running' GROUP BY org_id`)
	require.NoError(h.t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			org string
			n   int
		)
		require.NoError(h.t, rows.Scan(&org, &n))
		out[org] = n
	}
	require.NoError(h.t, rows.Err())
	return out
}

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
	require.Equal(t, map[string]int{"a": 1}, h.startedOf(), "a queued first and takes the first turn")
	require.Equal(t, orgTurns{served: 1, weight: 1}, h.l.turns.orgs["a"])
	h.complete(ids[0], "success", 1)
	require.NoError(t, h.l.saveTurns(h.ctx, time.Time{}), "the term's end saves")

	next := newLoop(h.m, "default")
	require.NoError(t, next.takeover(h.ctx))
	require.Equal(t, h.l.turns.orgs, next.turns.orgs, "the next term reads what the last one saved")
	require.Equal(t, [2]int64{h.l.turns.num, max(h.l.turns.den, 1)}, [2]int64{next.turns.num, next.turns.den})
	h.l = next
	h.runMain()

	require.Equal(t, map[string]int{"b": 1}, h.startedOf(), "b's turn, after the change of leader too")
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
		{"charged at another weight: a restarts at turn 0 and, queued first, goes first", 1, "a"},
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

			require.Equal(t, map[string]int{tc.wantFirst: 1}, h.startedOf())
		})
	}
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

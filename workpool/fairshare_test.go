package workpool

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func withKey(key string, limit int) workOpt {
	return func(p *EnqueueParams) { p.ConcurrencyKey, p.KeyLimit = key, limit }
}

// runningByOrg counts started work per org.
func (h *harness) runningByOrg() map[string]int {
	h.t.Helper()
	rows, err := h.db.Query(h.ctx, `SELECT org_id, count(*) FROM workpool_work WHERE state = 'running' GROUP BY org_id`)
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

func TestFairShare_OrgsWithReadyWorkTakeTurnsForFreeSlots(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	for range 10 {
		h.enqueue(withOrg("busy"))
	}
	h.clock.Advance(time.Millisecond) // the quiet org's work is younger
	h.enqueue(withOrg("quiet"))
	h.enqueue(withOrg("quiet"))

	h.runMain()

	require.Equal(t, map[string]int{"busy": 2, "quiet": 2}, h.runningByOrg())
}

func TestFairShare_AWeightedOrgGetsMoreTurns(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(4))
	require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "heavy", 3))
	for range 10 {
		h.enqueue(withOrg("heavy"))
		h.enqueue(withOrg("light"))
	}

	h.runMain()

	require.Equal(t, map[string]int{"heavy": 3, "light": 1}, h.runningByOrg())
}

func TestFairShare_MaxParallelismPerOrgCapsATenantWithoutIdlingSlots(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	cap2 := 2
	require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", &cap2))
	for range 10 {
		h.enqueue(withOrg("greedy"))
	}
	h.enqueue(withOrg("small"))

	h.runMain()
	require.Equal(t, map[string]int{"greedy": 2, "small": 1}, h.runningByOrg())

	h.runMain()
	require.Equal(t, map[string]int{"greedy": 2, "small": 1}, h.runningByOrg(), "the cap holds across iterations")
	info, err := h.m.Pool(h.ctx, "greedy", "default")
	require.NoError(t, err)
	require.Equal(t, int64(8), info.Pending)
	require.Equal(t, int64(2), info.Running)
}

func TestConcurrencyKey_LimitOneRunsKeyedWorkSeriallyInRunAtOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	var keyed []uuid.UUID
	for range 3 {
		keyed = append(keyed, h.enqueue(withKey("customer-7", 1)))
		h.clock.Advance(time.Millisecond)
	}
	free := h.enqueue()

	h.runMain()

	o := h.observe()
	require.ElementsMatch(t, []uuid.UUID{keyed[0], free}, o.running, "the blocked keyed items hold no slot")
	for i := 1; i < 3; i++ {
		h.complete(keyed[i-1], "success", 1)
		h.runMain()
		o = h.observe()
		require.True(t, o.isRunning(keyed[i]), "keyed item %d starts after %d finished", i, i-1)
		if i+1 < 3 {
			require.True(t, o.isPending(keyed[i+1]))
		}
	}
}

func TestConcurrencyKey_IsScopedToTheOrgAndHonoursItsLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	for range 4 {
		h.enqueue(withKey("k", 2))
		h.enqueue(withOrg("org-2"), withKey("k", 2))
	}

	h.runMain()

	require.Equal(t, map[string]int{"org-1": 2, "org-2": 2}, h.runningByOrg())
}

func TestConcurrencyKey_WorkWaitingBehindItsKeyLeavesTheLoopScheduledWithoutPolling(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	first := h.enqueue(withKey("k", 1))
	h.enqueue(withKey("k", 1))
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)

	res := h.runMain()

	o := h.observe()
	require.Equal(t, "scheduled", o.runStatus.Kind, "work waits behind its key: a completion will wake the loop")
	require.False(t, res.wakeAt.Before(h.clock.Now().Add(time.Second)), "no short polling timer: %v", res.wakeAt.Sub(h.clock.Now()))
	require.False(t, o.runStatus.Saturated)
	h.complete(first, "success", 1)
	h.runMain()
	require.Len(t, h.observe().running, 1)
	require.Empty(t, h.observe().pending)
}

// A key's items may carry different limits: the start reads the limit of
// the key's earliest ready item (by run_at), so that is the one that
// applies.
func TestConcurrencyKey_TheEarliestPendingItemsLimitApplies(t *testing.T) {
	for _, tc := range []struct {
		name        string
		limits      []int // in run_at order
		wantRunning int
	}{
		{"a serial item first", []int{1, 3, 3, 3}, 1},
		{"a wider item first", []int{3, 1, 1, 1}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(10))
			for _, l := range tc.limits {
				h.enqueue(withKey("k", l))
				h.clock.Advance(time.Millisecond)
			}

			h.runMain()

			require.Len(t, h.observe().running, tc.wantRunning)
		})
	}
}

func TestConcurrencyKey_LongerThan200CharactersIsInvalid(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		key   string
		valid bool
	}{
		{strings.Repeat("é", 200), true}, // characters, not bytes
		{strings.Repeat("k", 201), false},
		{"a\x00b", false},
	} {
		_, err := h.m.Enqueue(h.ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle", ConcurrencyKey: tc.key})
		if tc.valid {
			require.NoError(t, err)
		} else {
			requireInvalid(t, err, "concurrency_key")
		}
	}
}

// What the pool info says an org's ready work waits for, besides free
// slots: its keys' limits and the per-org cap (PoolInfo's definitions).
func TestPoolInfo_CountsReadyWorkHeldBackByKeysAndTheOrgCap(t *testing.T) {
	for _, tc := range []struct {
		name                string
		perOrg              *int
		enqueue             func(h *harness)
		blockedKey, blocked int64
	}{
		{"a serial key with three items", nil, func(h *harness) {
			for range 3 {
				h.enqueue(withKey("k", 1))
			}
		}, 2, 0},
		{"a key of limit 2 with five items, and plain work", nil, func(h *harness) {
			for range 5 {
				h.enqueue(withKey("k", 2))
			}
			h.enqueue()
		}, 3, 0},
		{"mixed limits: the earliest item's (1) applies", nil, func(h *harness) {
			for _, l := range []int{1, 3, 3} {
				h.enqueue(withKey("k", l))
				h.clock.Advance(time.Millisecond)
			}
		}, 2, 0},
		{"work not yet due is not ready", nil, func(h *harness) {
			h.enqueue(withKey("k", 1))
			h.enqueue(withKey("k", 1), withRunAt(h.clock.Now().Add(time.Hour)))
		}, 0, 0},
		{"a cap of 2 with five plain items", ptr(2), func(h *harness) {
			for range 5 {
				h.enqueue()
			}
		}, 0, 3},
		{"a cap of 3 over a serial key and two plain items: the key's blocked items are not the cap's", ptr(3), func(h *harness) {
			for range 4 {
				h.enqueue(withKey("k", 1))
			}
			h.enqueue()
			h.enqueue()
		}, 3, 0},
		{"a cap of 2 over a serial key and two plain items", ptr(2), func(h *harness) {
			for range 4 {
				h.enqueue(withKey("k", 1))
			}
			h.enqueue()
			h.enqueue()
		}, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(1)) // one slot: most work waits for a slot, which counts for neither
			if tc.perOrg != nil {
				require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", tc.perOrg))
			}
			tc.enqueue(h)

			info, err := h.m.Pool(h.ctx, "org-1", "default")
			require.NoError(t, err)
			require.Equal(t, tc.blockedKey, info.BlockedByKey, "blocked by key")
			require.Equal(t, tc.blocked, info.BlockedByOrgCap, "blocked by the org's cap")
			other, err := h.m.Pool(h.ctx, "org-2", "default")
			require.NoError(t, err)
			require.Zero(t, other.BlockedByKey+other.BlockedByOrgCap, "another org's work is not counted")
		})
	}
}

// Running work takes from the room of its key and of its org's cap.
func TestPoolInfo_RunningWorkTakesTheRoomOfItsKeyAndCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", ptr(2)))
	h.enqueue(withKey("k", 1))
	h.enqueue()
	h.runMain() // both start: the cap is full, the key too
	h.enqueue(withKey("k", 1))
	h.enqueue()

	info, err := h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.Equal(t, int64(2), info.Running)
	require.Equal(t, int64(2), info.Pending)
	require.Equal(t, int64(1), info.BlockedByKey)
	require.Equal(t, int64(1), info.BlockedByOrgCap)
}

func TestUpdatePool_SetsRemovesAndClearsOrgWeights(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	weightOf := func(org string) int {
		t.Helper()
		info, err := h.m.Pool(h.ctx, org, "default")
		require.NoError(t, err)
		return info.Weight
	}

	require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{OrgWeights: map[string]*int{"a": ptr(3), "b": ptr(5), "c": ptr(7)}}))
	require.Equal(t, []int{3, 5, 7, 1}, []int{weightOf("a"), weightOf("b"), weightOf("c"), weightOf("d")})
	ws, err := h.m.OrgWeights(h.ctx, "default")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"a": 3, "b": 5, "c": 7}, ws)

	require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{OrgWeights: map[string]*int{"a": nil, "b": ptr(1)}}))
	ws, err = h.m.OrgWeights(h.ctx, "default")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"c": 7}, ws, "null and 1 both give the default weight")

	require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{ClearOrgWeights: true, OrgWeights: map[string]*int{"d": ptr(2)}}))
	ws, err = h.m.OrgWeights(h.ctx, "default")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"d": 2}, ws, "cleared, then set")

	require.ErrorIs(t, h.m.UpdatePool(h.ctx, "missing", PoolUpdate{OrgWeights: map[string]*int{"a": ptr(2)}}), ErrPoolNotFound)
}

// One bad weight — or a bad limit next to good weights — writes nothing.
func TestUpdatePool_ABadWeightNamesItsOrgAndWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		u     PoolUpdate
		field string
	}{
		{"a weight of 0", PoolUpdate{MaxParallelism: ptr(9), OrgWeights: map[string]*int{"org-6": ptr(4), "org-7": ptr(0)}}, "org_weights.org-7"},
		{"a weight of 101", PoolUpdate{ClearOrgWeights: true, OrgWeights: map[string]*int{"org-7": ptr(101)}}, "org_weights.org-7"},
		{"an empty org", PoolUpdate{OrgWeights: map[string]*int{"": ptr(2)}}, "org_weights."},
		{"a bad limit beside good weights", PoolUpdate{MaxParallelism: ptr(0), OrgWeights: map[string]*int{"org-6": ptr(4)}}, "max_parallelism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(7))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "org-5", 2))

			requireInvalid(t, h.m.UpdatePool(h.ctx, "default", tc.u), tc.field)

			ws, err := h.m.OrgWeights(h.ctx, "default")
			require.NoError(t, err)
			require.Equal(t, map[string]int{"org-5": 2}, ws)
			info, err := h.m.Pool(h.ctx, "org-1", "default")
			require.NoError(t, err)
			require.Equal(t, 7, info.MaxParallelism)
		})
	}
}

// In a saturated pool slots come free a few at a time; fair share counts
// the slots each org already holds, so one-at-a-time refills keep every
// org at its weighted share — not in run_at order, which would hand the
// pool to whoever queued first.
func TestFairShare_RefillsOneSlotAtATimeKeepTheWeightedShare(t *testing.T) {
	for _, tc := range []struct {
		name          string
		heavyWeight   int
		queued        []string // orgs in the order their 30 items each were queued ("" interleaves)
		wantHeavyRuns int      // of the 4 slots, after every refill
	}{
		{"weights 3:1, interleaved backlogs", 3, nil, 3},
		{"weights 3:1, the light org queued first", 3, []string{"light", "heavy"}, 3},
		{"weights 3:1, the heavy org queued first", 3, []string{"heavy", "light"}, 3},
		{"equal weights, one org queued first", 1, []string{"heavy", "light"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(4))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "heavy", tc.heavyWeight))
			enqueue := func(org string) {
				h.enqueue(withOrg(org))
				h.clock.Advance(time.Millisecond)
			}
			if tc.queued == nil {
				for range 30 {
					enqueue("light")
					enqueue("heavy")
				}
			}
			for _, org := range tc.queued {
				for range 30 {
					enqueue(org)
				}
			}
			h.runMain()
			require.Equal(t, tc.wantHeavyRuns, h.runningByOrg()["heavy"], "the first fill")
			for step := range 20 {
				// Every attempt takes as long: the one started first finishes
				// first, and the loop fills its slot.
				var id uuid.UUID
				require.NoError(t, h.db.QueryRow(h.ctx,
					`SELECT id FROM workpool_work WHERE state = 'running' ORDER BY started_at, run_at LIMIT 1`).Scan(&id))
				h.clock.Advance(time.Millisecond)
				h.complete(id, "success", 1)
				h.runMain()
				require.Equal(t, map[string]int{"heavy": tc.wantHeavyRuns, "light": 4 - tc.wantHeavyRuns}, h.runningByOrg(),
					"after refill %d each org holds its share", step)
			}
			started := map[string]int{}
			for _, org := range []string{"heavy", "light"} {
				info, err := h.m.Pool(h.ctx, org, "default")
				require.NoError(t, err)
				started[org] = 30 - int(info.Pending)
			}
			want := float64(tc.wantHeavyRuns) / float64(4-tc.wantHeavyRuns)
			require.InDelta(t, want, float64(started["heavy"])/float64(started["light"]), want/4, "starts split as the weights: %v", started)
		})
	}
}

package workpool

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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

// A key bounds what runs at once; it does not hold its successors behind
// a retry: a failed attempt's retry waits at its backoff's run_at, and the
// key's next item, earlier now, takes the slot (docs/workpool.md §
// "Concurrency keys"). The retry starts again once that one finished and
// its time has come.
func TestConcurrencyKey_ARetryWaitsAtItsBackoffWhileTheKeysNextItemRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(10))
	first := h.enqueue(withKey("customer-7", 1), withRetry(3, 60_000, 2))
	h.clock.Advance(time.Millisecond)
	second := h.enqueue(withKey("customer-7", 1))

	h.runMain()
	require.True(t, h.observe().isRunning(first))
	h.complete(first, "failed", 1)

	h.runMain()
	o := h.observe()
	require.True(t, o.isPending(first), "the retry waits out its backoff")
	require.True(t, o.isRunning(second), "the key's next item runs meanwhile")

	h.complete(second, "success", 1)
	h.runMain()
	require.True(t, h.observe().isPending(first), "not before its backoff's end")
	h.clock.Advance(2 * time.Minute)
	h.runMain()
	require.True(t, h.observe().isRunning(first), "then the retry runs")
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

// An org whose ready work all waits behind its keys takes no share of the
// free slots: the share it would have been dealt went idle while another
// org's work was ready, at every iteration until the key's running item
// finished. In a pool of 10, four such orgs held 3 slots idle.
func TestConcurrencyKey_AnOrgBlockedByItsKeysLeavesItsShareToOthers(t *testing.T) {
	for _, fullOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("full iteration %t", fullOnly), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(10))
			h.l.fullOnly = fullOnly
			keyed := []string{"k1", "k2", "k3", "k4"}
			for _, org := range keyed {
				for range 2 {
					h.enqueue(withOrg(org), withKey("k", 1))
					h.clock.Advance(time.Millisecond)
				}
			}
			for range 27 {
				h.enqueue(withOrg("b"))
				h.clock.Advance(time.Millisecond)
			}

			for range 3 {
				h.runMain()
			}

			require.Equal(t, map[string]int{"k1": 1, "k2": 1, "k3": 1, "k4": 1, "b": 6}, h.runningByOrg(),
				"every slot the keys leave goes to b's ready work")
			info, err := h.m.Pool(h.ctx, "k1", "default")
			require.NoError(t, err)
			require.Equal(t, int64(1), info.BlockedByKey)
		})
	}
}

// Whatever the mix of orgs, keys and cap, once the loop has nothing more to
// start no slot is free while work it may start waits: a ready plain item
// of an org under its cap, or a ready keyed item whose key is under its
// limit. And no key or org is ever past its limit. Random pools, each
// burnt down through rounds of starts and completions.
func TestFairShare_NoSlotIdlesWhileWorkThatMayStartWaits(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 13))
	for i := range 16 {
		maxPar, fullOnly := 2+rng.IntN(12), i%2 == 1
		var perOrgCap *int
		if rng.IntN(2) == 0 {
			perOrgCap = ptr(1 + rng.IntN(4))
		}
		type spec struct {
			org, key string
			limit    int
		}
		var items []spec
		for o := range 2 + rng.IntN(4) {
			org := fmt.Sprintf("org-%d", o)
			for range rng.IntN(8) {
				items = append(items, spec{org: org})
			}
			for k := range rng.IntN(3) {
				limit := 1 + rng.IntN(2) // one limit per key: the oracle needs no earliest item
				for range 1 + rng.IntN(5) {
					items = append(items, spec{org: org, key: fmt.Sprintf("k%d", k), limit: limit})
				}
			}
		}
		rng.Shuffle(len(items), func(a, b int) { items[a], items[b] = items[b], items[a] })
		seed, capName := rng.Uint64(), "none"
		if perOrgCap != nil {
			capName = fmt.Sprint(*perOrgCap)
		}
		t.Run(fmt.Sprintf("pool %d: %d slots, cap %s, %d items, full iteration %t", i, maxPar, capName, len(items), fullOnly), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(maxPar))
			h.l.fullOnly = fullOnly
			if perOrgCap != nil {
				withPerOrgCap(t, h, *perOrgCap)
			}
			for _, it := range items {
				opts := []workOpt{withOrg(it.org)}
				if it.key != "" {
					opts = append(opts, withKey(it.key, it.limit))
				}
				h.enqueue(opts...)
				h.clock.Advance(time.Millisecond)
			}
			capSQL := "NULL::int"
			if perOrgCap != nil {
				capSQL = fmt.Sprint(*perOrgCap)
			}
			rng := rand.New(rand.NewPCG(seed, 1))
			for round := 0; ; round++ {
				require.Less(t, round, 200, "the burn-down ends")
				for n := 0; h.runMain().didWork; n++ {
					require.Less(t, n, 50, "the loop settles")
				}
				var overKey, overCap, idleBeside int
				require.NoError(t, h.db.QueryRow(h.ctx, `
					WITH running AS (SELECT org_id, concurrency_key, key_limit FROM workpool_work WHERE pool = 'default' AND state = 'running'),
					by_org AS (SELECT org_id, count(*) AS n FROM running GROUP BY org_id),
					by_key AS (SELECT org_id, concurrency_key, count(*) AS n FROM running WHERE concurrency_key IS NOT NULL GROUP BY 1, 2),
					free AS (SELECT $1::int - (SELECT count(*) FROM running) AS n)
					SELECT
					  (SELECT count(*) FROM by_key k WHERE k.n > (SELECT max(key_limit) FROM workpool_work w
					     WHERE w.pool = 'default' AND w.org_id = k.org_id AND w.concurrency_key = k.concurrency_key)),
					  (SELECT count(*) FROM by_org WHERE `+capSQL+` IS NOT NULL AND n > `+capSQL+`),
					  (SELECT count(*) FROM workpool_work w
					   LEFT JOIN by_org o ON o.org_id = w.org_id
					   LEFT JOIN by_key k ON k.org_id = w.org_id AND k.concurrency_key = w.concurrency_key
					   WHERE w.pool = 'default' AND w.state = 'pending' AND w.run_at <= $2 AND (SELECT n FROM free) > 0
					     AND (`+capSQL+` IS NULL OR coalesce(o.n, 0) < `+capSQL+`)
					     AND (w.concurrency_key IS NULL OR coalesce(k.n, 0) < w.key_limit))`,
					maxPar, h.clock.Now()).Scan(&overKey, &overCap, &idleBeside))
				require.Zero(t, overKey, "round %d: a key past its limit", round)
				require.Zero(t, overCap, "round %d: an org past the cap", round)
				require.Zero(t, idleBeside, "round %d: a slot is free while %d items that may start wait: %v", round, idleBeside, h.runningByOrg())
				running := h.observe().running
				if len(running) == 0 {
					require.Empty(t, h.observe().pending, "nothing runs, so nothing waits")
					return
				}
				rng.Shuffle(len(running), func(a, b int) { running[a], running[b] = running[b], running[a] })
				for _, id := range running[:1+rng.IntN(len(running))] {
					h.complete(id, "success", 1)
				}
			}
		})
	}
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

func TestConcurrencyKey_LongerThan200CharactersOrBlankIsInvalid(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		key   string
		valid bool
	}{
		{strings.Repeat("é", 200), true}, // characters, not bytes
		{strings.Repeat("k", 201), false},
		{"a\x00b", false},
		{" \t ", false},
		{" k ", true},
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

// A change to a pool's weights, alone or with its limits in one PATCH: a
// fast fair iteration that took its snapshot before the change committed,
// and then waited for the pool row the change held, read the new limits
// from the row but the old weights from its snapshot — a state that never
// existed (9 new slots shared 1:1, not 3:1). With the weights alone it saw
// no change at all: it compared the row's limits and pause, which the
// change left as they were. It picks nothing instead, and the full
// iteration after it picks with the whole change.
func TestUpdatePool_AFastFairPickSeesAWholeChangeOrNoneOfIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		// limit: the change sets max_parallelism 9 with the weights (else
		// 9 is set before, and the change sets the weights alone)
		limit bool
	}{
		{"limits and weights", true},
		{"weights alone", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			setUp := func() *harness {
				h := newHarness(t, withMaxParallelism(1))
				for range 10 {
					h.enqueue(withOrg("a"))
					h.enqueue(withOrg("b"))
					h.clock.Advance(time.Millisecond)
				}
				h.runMain()
				require.True(t, h.l.shared, "from now on the loop starts fairly in one statement")
				running := h.observe().running
				require.Len(t, running, 1)
				h.complete(running[0], "success", 1)
				if !tc.limit {
					require.NoError(t, h.m.SetMaxParallelism(h.ctx, "default", 9))
				}
				return h
			}
			// The change's statements, as UpdatePool runs them, in a
			// transaction left open.
			change := func(h *harness) pgx.Tx {
				tx, err := h.db.Begin(h.ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				limit := ptr(int32(9))
				if !tc.limit {
					limit = nil
				}
				_, err = tx.Exec(h.ctx, sqlUpdatePool, "default", limit, false, (*int32)(nil), (*bool)(nil))
				require.NoError(t, err)
				_, err = tx.Exec(h.ctx, sqlSetOrgWeights, "default", []string{"a"}, []int32{3})
				require.NoError(t, err)
				return tx
			}

			settled := setUp()
			require.NoError(t, change(settled).Commit(settled.ctx))
			settled.runMain()
			want := settled.runningByOrg()
			require.Equal(t, map[string]int{"a": 7, "b": 2}, want, "9 slots at weights 3:1 (b's one start before counts)")

			h := setUp()
			tx := change(h)
			picked := h.iterateHeldAtThePoolRow()
			require.NoError(t, tx.Commit(h.ctx))
			<-picked
			// The fast statement that straddled the change started nothing,
			// and the full iteration that follows it at once (a fast one
			// that starts nothing always goes on to it) started with the
			// whole change.
			require.Equal(t, want, h.runningByOrg(), "never a mix of the change's two states")
		})
	}
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

// In a saturated pool slots come free a few at a time; the orgs take turns
// for them by starts, so one-at-a-time refills keep every org at its
// weighted share — not in run_at order, which would hand the pool to
// whoever queued first. With attempts of equal length, the slots each org
// holds stay within one of its weighted share.
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
				running := h.runningByOrg()
				require.Equal(t, 4, running["heavy"]+running["light"], "after refill %d every slot is taken", step)
				require.InDelta(t, tc.wantHeavyRuns, running["heavy"], 1, "after refill %d each org holds its share: %v", step, running)
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

// The fair pick reads each org's queue only as far as the org's share of
// the free slots can reach (queries.go, sqlPickFair's bound), not the free
// slots' worth from every org. Whatever the weights, the slots the orgs
// already hold, their backlogs and the per-org cap, it must start what the
// whole fair order would: every iteration starts the next items of that
// order (all of the free slots' worth when every org has work enough, a
// first part of it when some org's queue runs out first), and the loop
// ends up with exactly the order's first free slots' worth. The order is
// computed here from every ready item: an org's n-th ready item (within
// the cap's room) takes the turn (running + n - 1) / weight (nothing is
// charged to any org yet, so the slots held decide), ties to
// (running + n) / weight, then in run_at order.
func TestFairShare_APickStartsTheNextItemsOfTheWholeFairOrder(t *testing.T) {
	type org struct {
		name                     string
		weight, running, backlog int
	}
	type scenario struct {
		maxPar int
		cap    *int
		orgs   []org
		queued []int // the orgs (by index) of the ready items, in run_at order
		// enough: every org has more ready items than there are slots
		enough bool
	}
	rng := rand.New(rand.NewPCG(13, 18))
	var scenarios []scenario
	for i := range 12 {
		sc := scenario{maxPar: 2 + rng.IntN(30), enough: i%2 == 0}
		if rng.IntN(3) == 0 {
			sc.cap = ptr(1 + rng.IntN(6))
		}
		held := 0
		for i := range 2 + rng.IntN(7) {
			o := org{name: fmt.Sprintf("org-%d", i), weight: 1 + rng.IntN(4), backlog: rng.IntN(12)}
			if sc.enough {
				o.backlog = sc.maxPar + 1
			}
			if rng.IntN(4) == 0 {
				o.weight = 1 + rng.IntN(100)
			}
			o.running = min(rng.IntN(4), sc.maxPar-1-held) // at least one slot stays free
			held += o.running
			sc.orgs = append(sc.orgs, o)
		}
		// One org far past its share, as after a burst of its own.
		sc.orgs[0].running += min(rng.IntN(sc.maxPar), sc.maxPar-1-held)
		for i, o := range sc.orgs {
			for range o.backlog {
				sc.queued = append(sc.queued, i)
			}
		}
		rng.Shuffle(len(sc.queued), func(i, j int) { sc.queued[i], sc.queued[j] = sc.queued[j], sc.queued[i] })
		scenarios = append(scenarios, sc)
	}
	for i, sc := range scenarios {
		for _, fullOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("scenario %d, full iteration %t", i, fullOnly), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, withMaxParallelism(sc.maxPar))
				h.l.fullOnly = fullOnly
				if sc.cap != nil {
					require.NoError(t, h.m.SetMaxParallelismPerOrg(h.ctx, "default", sc.cap))
				}
				type item struct {
					id    uuid.UUID
					org   org
					n     int // the item's place among its org's ready items, from 1
					runAt time.Time
				}
				var ready []item
				running := 0
				for _, o := range sc.orgs {
					if o.weight != 1 {
						require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", o.name, o.weight))
					}
					for range o.running {
						id := h.enqueue(withOrg(o.name))
						h.exec(`UPDATE workpool_work SET state = 'running', started_at = $2 WHERE id = $1`, id, h.clock.Now())
						running++
					}
				}
				// The orgs' backlogs interleave, each item at its own run_at
				// (so that the order has no ties left to chance).
				seen := map[int]int{}
				for at, i := range sc.queued {
					o := sc.orgs[i]
					seen[i]++
					runAt := h.clock.Now().Add(-time.Hour + time.Duration(at)*time.Millisecond)
					ready = append(ready, item{id: h.enqueue(withOrg(o.name), withRunAt(runAt)), org: o, n: seen[i], runAt: runAt})
				}
				// The whole fair order, and how many of it the free slots take.
				var order []item
				for _, it := range ready {
					if sc.cap == nil || it.n <= *sc.cap-it.org.running {
						order = append(order, it)
					}
				}
				slices.SortFunc(order, func(a, b item) int {
					// Nothing charged yet: the turn is the slots held,
					// (running + n - 1) / weight, ties to (running + n) /
					// weight, compared exactly.
					held := func(it item) int { return it.org.running + it.n - 1 }
					if c := cmp.Compare(held(a)*b.org.weight, held(b)*a.org.weight); c != 0 {
						return c
					}
					if c := cmp.Compare((a.org.running+a.n)*b.org.weight, (b.org.running+b.n)*a.org.weight); c != 0 {
						return c
					}
					return a.runAt.Compare(b.runAt)
				})
				want := order[:min(len(order), sc.maxPar-running)]
				if !fullOnly {
					// The fast statement that shares fairly, as while a busy
					// pool's orgs share it (no recovery due).
					h.l.shared, h.l.lastRecovery = true, h.clock.Now()
				}

				startedIDs := func() []uuid.UUID {
					var ids []uuid.UUID
					for _, it := range order {
						if h.work(it.id).state == "running" {
							ids = append(ids, it.id)
						}
					}
					return ids
				}
				ids := func(items []item) []uuid.UUID {
					out := make([]uuid.UUID, len(items))
					for i, it := range items {
						out[i] = it.id
					}
					return out
				}
				h.runMain()
				first := startedIDs()
				if len(want) > 0 {
					require.NotEmpty(t, first, "the first iteration starts work")
					if !fullOnly {
						require.Positive(t, h.l.fastStarts, "the fast statement started them")
					}
				}
				require.ElementsMatch(t, ids(order[:len(first)]), first, "the first iteration starts the first of the fair order")
				if sc.enough {
					require.Len(t, first, len(want), "every org has work enough: one iteration fills the free slots")
				}
				for range 5 {
					h.runMain()
				}
				require.ElementsMatch(t, ids(want), startedIDs(), "the loop starts exactly the fair order's first %d", len(want))
				require.Equal(t, running+len(want), slotsInUse(t, h.db, "default"), "no other work started")
			})
		}
	}
}

// startsInTurn runs the pool attempt by attempt — the oldest running
// attempt finishes, the loop refills — until n items have started since
// the pool was created, and returns the orgs of the first n starts in the
// order the loop made them (one refill's starts in run_at order).
func (h *harness) startsInTurn(n int) []string {
	h.t.Helper()
	order := func() []string {
		rows, err := h.db.Query(h.ctx, `SELECT org_id FROM workpool_work WHERE started_at IS NOT NULL ORDER BY started_at, run_at`)
		require.NoError(h.t, err)
		orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(h.t, err)
		return orgs
	}
	h.runMain()
	for len(order()) < n {
		var id uuid.UUID
		require.NoError(h.t, h.db.QueryRow(h.ctx,
			`SELECT id FROM workpool_work WHERE state = 'running' ORDER BY started_at, run_at LIMIT 1`).Scan(&id))
		h.clock.Advance(time.Millisecond)
		h.complete(id, "success", 1)
		h.runMain()
	}
	return order()[:n]
}

func countOf(orgs []string, org string) int {
	n := 0
	for _, o := range orgs {
		if o == org {
			n++
		}
	}
	return n
}

// A pool of one, two or three slots has too few running attempts to tell
// the orgs apart: the turns are counted in starts, so orgs with a backlog
// alternate in one slot and a weight of 3 gets three starts for every one,
// whoever queued first — the backlog of the org that queued first used to
// run to its end before the other's first start (weights 3:1 in two slots:
// the light org never started). In three slots the slots held count too:
// the light org holding one of them waits a turn, and 3:1 splits them 2:1,
// each org within one slot of its share.
func TestFairShare_SmallPoolsTakeTurnsByStarts(t *testing.T) {
	for _, tc := range []struct {
		slots, heavyWeight int
		first              string // the org whose whole backlog is queued first
		wantHeavy          int    // of the first 24 starts
	}{
		{1, 1, "heavy", 12},
		{1, 1, "light", 12},
		{2, 1, "heavy", 12},
		{1, 3, "light", 18},
		{1, 3, "heavy", 18},
		{2, 3, "light", 18},
		{3, 3, "heavy", 16},
		{3, 3, "light", 16},
	} {
		t.Run(fmt.Sprintf("%d slots, weights %d:1, %s queued first", tc.slots, tc.heavyWeight, tc.first), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(tc.slots))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "heavy", tc.heavyWeight))
			other := map[string]string{"heavy": "light", "light": "heavy"}[tc.first]
			for _, org := range []string{tc.first, other} {
				for range 40 {
					h.enqueue(withOrg(org))
					h.clock.Advance(time.Millisecond)
				}
			}
			starts := h.startsInTurn(24)
			require.InDelta(t, tc.wantHeavy, countOf(starts, "heavy"), 1, "starts: %v", starts)
			// No run of one org longer than its weight's worth of turns.
			longest, run := 0, 0
			for i, o := range starts {
				if i > 0 && o == starts[i-1] {
					run++
				} else {
					run = 1
				}
				if o == "light" {
					longest = max(longest, run)
				}
			}
			require.LessOrEqual(t, longest, 2, "the light org never holds the slots for a run: %v", starts)
		})
	}
}

// An org charged few starts that then had no ready work while the others
// took many turns does not cash in its idle time when its work comes
// back: it joins at the pool's current turn and takes its share from
// there, not every start until its count catches up.
func TestFairShare_AnOrgBackFromIdleJoinsAtTheCurrentTurn(t *testing.T) {
	h := newHarness(t, withMaxParallelism(1))
	for range 3 {
		for _, org := range []string{"a", "b", "c"} {
			h.enqueue(withOrg(org))
			h.clock.Advance(time.Millisecond)
		}
	}
	for range 20 {
		for _, org := range []string{"a", "b"} {
			h.enqueue(withOrg(org))
			h.clock.Advance(time.Millisecond)
		}
	}
	// c's three items run out within the first nine starts; a and b take
	// turns for the next thirty.
	first := h.startsInTurn(39)
	require.Equal(t, 3, countOf(first, "c"), "c had three items: %v", first)
	for range 20 {
		h.enqueue(withOrg("c"))
		h.clock.Advance(time.Millisecond)
	}
	// The oldest running attempt finishes and c's work is ready: of the next
	// nine starts c takes a third, not all of them.
	next := h.startsInTurn(39 + 9)[39:]
	require.InDelta(t, 3, countOf(next, "c"), 1, "c joins at the current turn: %v", next)
}

// Turns count starts, but an org's slots still count against it: an org
// whose attempts run for hours does not take every other start until it
// holds every slot while another org's quick work waits — it holds at most
// its share, rounded up, and one slot more only while it is alone with a
// free one.
func TestFairShare_AnOrgWhoseWorkRunsLongDoesNotTakeEverySlot(t *testing.T) {
	for _, tc := range []struct {
		slots, slowWeight, quickWeight, maxSlow int
	}{
		{4, 1, 1, 2},
		{2, 1, 1, 1},
		{2, 1, 3, 1}, // a review found the slow org holding both
		{10, 1, 3, 3},
	} {
		t.Run(fmt.Sprintf("%d slots, weights %d:%d", tc.slots, tc.slowWeight, tc.quickWeight), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(tc.slots))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "slow", tc.slowWeight))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "quick", tc.quickWeight))
			for range 60 {
				h.enqueue(withOrg("slow"))
				h.clock.Advance(time.Millisecond)
				h.enqueue(withOrg("quick"))
				h.clock.Advance(time.Millisecond)
			}
			h.runMain()
			for step := range 30 {
				running := h.runningByOrg()
				require.LessOrEqual(t, running["slow"], tc.maxSlow, "step %d: the slow org holds at most its share: %v", step, running)
				// Only the quick org's attempts ever finish.
				var id uuid.UUID
				require.NoError(t, h.db.QueryRow(h.ctx,
					`SELECT id FROM workpool_work WHERE state = 'running' AND org_id = 'quick' ORDER BY started_at, run_at LIMIT 1`).Scan(&id))
				h.clock.Advance(time.Millisecond)
				h.complete(id, "success", 1)
				h.runMain()
			}
		})
	}
}

// The starts charged are counted at the org's weight: a weight lowered
// after a long run read the org's history as far ahead of everyone, and it
// started nothing until the others caught up (a review: heavy at 3, then
// 1 — the next 20 starts were all the other org's). A weight change
// starts the org's turns again at the pool's current turn.
func TestFairShare_ALoweredWeightDoesNotStallTheOrg(t *testing.T) {
	for _, change := range []struct {
		name string
		do   func(h *harness)
	}{
		{"set to 1", func(h *harness) { require.NoError(h.t, h.m.SetOrgWeight(h.ctx, "default", "heavy", 1)) }},
		{"back to the default", func(h *harness) {
			err := h.m.UpdatePool(h.ctx, "default", PoolUpdate{OrgWeights: map[string]*int{"heavy": nil}})
			require.NoError(h.t, err)
		}},
		{"every weight cleared", func(h *harness) {
			err := h.m.UpdatePool(h.ctx, "default", PoolUpdate{OrgWeights: map[string]*int{}, ClearOrgWeights: true})
			require.NoError(h.t, err)
		}},
	} {
		t.Run(change.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(1))
			require.NoError(t, h.m.SetOrgWeight(h.ctx, "default", "heavy", 3))
			for range 80 {
				h.enqueue(withOrg("heavy"))
				h.clock.Advance(time.Millisecond)
				h.enqueue(withOrg("light"))
				h.clock.Advance(time.Millisecond)
			}
			first := h.startsInTurn(40)
			require.InDelta(t, 30, countOf(first, "heavy"), 1, "3:1 first: %v", first)
			change.do(h)
			next := h.startsInTurn(60)[40:]
			require.InDelta(t, 10, countOf(next, "heavy"), 2, "then 1:1: %v", next)
		})
	}
}

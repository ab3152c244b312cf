package workpool

import (
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

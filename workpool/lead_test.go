package workpool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A fast start that takes every free slot leaves nothing for an iteration
// run at once to start: whatever frees a slot kicks the loop. So the loop
// waits (for that kick, or the cooldown's end) instead of iterating again,
// while a start that leaves a slot free looks again at once (the fair
// pick may stop short of the free slots).
func TestLoop_AStartThatFillsEveryFreeSlotWaitsForAKick(t *testing.T) {
	cases := []struct {
		name string
		orgs []string // of the items, in enqueue order
		// complete: how many running items complete before the fast start
		complete int
		// loopsAgain: the fast start leaves a free slot, so the loop
		// iterates again at once
		loopsAgain bool
	}{
		{name: "one org, backlog left", orgs: []string{"a", "a", "a", "a"}, complete: 1},
		{name: "two orgs (fair), backlog left", orgs: []string{"a", "b", "a", "b", "a"}, complete: 2},
		{name: "one org, a slot left free", orgs: []string{"a", "a", "a"}, complete: 2, loopsAgain: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(2))
			for _, org := range tc.orgs {
				h.enqueue(withOrg(org))
			}
			h.runMain()
			running := h.observe().running
			require.Len(t, running, 2)
			for _, id := range running[:tc.complete] {
				h.complete(id, "success", 1)
			}

			starts := h.l.fastStarts
			res := h.runMain()
			require.Equal(t, starts+1, h.l.fastStarts, "the fast path started work")
			require.Equal(t, tc.loopsAgain, res.didWork)
			if !tc.loopsAgain {
				require.Len(t, h.observe().running, 2, "every slot taken")
				require.Equal(t, "running", res.status.Kind)
				require.False(t, res.wakeAt.IsZero(), "it wakes by the cooldown's end at the latest")
				require.False(t, res.wakeAt.After(h.clock.Now().Add(h.m.cfg.Cooldown)))
			}
		})
	}
}

// A kick sent before an iteration reads the tables announced a change
// that iteration sees: it is spent, not left to wake the loop for an
// iteration that would find nothing.
func TestLoop_AKickSentBeforeAnIterationReadsIsSpentByIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(2))
	h.enqueue()
	h.runMain()

	h.l.kick(kickWork)
	h.runMain()
	require.Empty(t, h.l.kickc)
}

// An enqueue that commits while an iteration runs kicks the loop (the
// iteration may not have seen it), and the kick waits in the channel. When
// that iteration then publishes that nothing can start — the pool paused,
// or every slot taken past the cooldown — the kick can start nothing
// either: the waiting loop does not run another iteration for it, but
// still wakes for a kick that frees a slot or resumes the pool.
func TestLoop_AnEnqueueKickLeftByAnIterationThatFoundStartsBlockedDoesNotWakeIt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setUp func(h *harness)
	}{
		{"paused", func(h *harness) {
			require.NoError(t, h.m.Pause(h.ctx, "default"))
			h.enqueue()
		}},
		{"saturated", func(h *harness) {
			h.enqueue()
			h.enqueue()
			h.runMain()
			h.clock.Advance(DefaultCooldown + time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(1))
			tc.setUp(h)

			res := h.iterateAround(func() {
				h.enqueue()
				h.l.kick(kickEnqueue) // the enqueue's, sent while the iteration runs
				require.Len(t, h.l.kickc, 1)
			})
			require.False(t, res.didWork)
			require.Equal(t, "scheduled", h.observe().runStatus.Kind)
			require.True(t, h.l.startsBlocked.Load(), "the iteration published that nothing can start")

			woke := make(chan struct{})
			go func() { h.l.wait(h.ctx, time.Time{}); close(woke) }()
			// Past the loop's verdict on the enqueue's kick (not merely its
			// receipt: a kickWork landing between the two would make that
			// verdict "not moot" and leave the kickWork in the channel).
			require.Eventually(t, func() bool { return h.l.mootKicks.Load() == 1 }, 10*time.Second, time.Millisecond,
				"the waiting loop takes the enqueue's kick and keeps waiting")
			require.Empty(t, h.l.kickc)
			h.l.kick(kickWork) // a slot freed, or the pool resumed
			<-woke
			require.Len(t, h.l.kickc, 0, "the loop woke for the kick that can start work, not the enqueue's")
			require.EqualValues(t, 1, h.l.mootKicks.Load())
		})
	}
}

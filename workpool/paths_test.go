package workpool

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// itemState is what an item's row says, for comparing two pools that were
// given the same inputs.
type itemState struct {
	State    string
	Attempts int
	Outcome  string
	Canceled bool
	Hook     string
}

func (h *harness) itemStates(ids []uuid.UUID) []itemState {
	h.t.Helper()
	out := make([]itemState, len(ids))
	for i, id := range ids {
		w := h.work(id)
		s := itemState{State: w.state, Attempts: w.attempts, Canceled: w.canceled}
		if w.outcome != nil {
			s.Outcome = *w.outcome
		}
		if w.hook != nil {
			s.Hook = *w.hook
		}
		out[i] = s
	}
	return out
}

// The fast iteration (one statement) and the full one (a transaction of
// steps) are built from the same fragments and must mean the same: two
// pools fed the same random sequence of enqueues, completions (successes,
// retryable and final failures), cancelations, clock moves, recoveries,
// pauses and resumes —
// one loop free to take the fast path, the other held to the full one —
// end every step with the same items in the same states and the same slots
// in use.
func TestIterations_FastAndFullAgreeOnTheSameInputs(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 12))
			// Half the seeds use one org only, so that the plain fast
			// statement does the starting; the others mix orgs and keys, so
			// that it hands over to the full iteration and then to the shared
			// fast statement.
			orgs := []string{"org-1"}
			if seed%2 == 1 {
				orgs = append(orgs, "org-2")
			}
			fast, full := newHarness(t, withMaxParallelism(3)), newHarness(t, withMaxParallelism(3))
			full.l.fullOnly = true
			pair := []*harness{fast, full}
			fast.m.RegisterHook("count", recordHook)
			full.m.RegisterHook("count", recordHook)
			hookTable(t, fast.db)
			hookTable(t, full.db)
			var ids [2][]uuid.UUID
			for step := range 80 {
				op := rng.IntN(11)
				switch {
				case op < 3: // enqueue
					opts := []workOpt{withOrg(orgs[rng.IntN(len(orgs))]), withHook("count", `{}`)}
					if rng.IntN(2) == 0 {
						// No backoff: a retry's run_at is the moment of its failure,
						// the same on both pools (jitter would order them apart).
						opts = append(opts, withRetry(3, 0, 1))
					}
					later := rng.IntN(5) == 0
					if len(orgs) > 1 && rng.IntN(4) == 0 {
						opts = append(opts, func(p *EnqueueParams) { p.ConcurrencyKey = "k" })
					}
					for i, h := range pair {
						o := opts
						if later {
							o = append(o[:len(o):len(o)], withRunAt(h.clock.Now().Add(500*time.Millisecond)))
						}
						ids[i] = append(ids[i], h.enqueue(o...))
						h.clock.Advance(time.Millisecond) // distinct run_at: one start order
					}
				case op < 6: // an iteration
					for _, h := range pair {
						h.runMain()
					}
				case op < 8: // an executor reports one running item
					running := indexesIn(fast, ids[0], "running")
					if len(running) == 0 {
						continue
					}
					i := running[rng.IntN(len(running))]
					kind := []string{"success", "failed", "final"}[rng.IntN(3)]
					for k, h := range pair {
						h.complete(ids[k][i], kind, h.work(ids[k][i]).attempts+1)
						h.clock.Advance(time.Millisecond)
					}
				case op < 9: // a cancelation
					if len(ids[0]) == 0 {
						continue
					}
					i := rng.IntN(len(ids[0]))
					for k, h := range pair {
						h.cancel(ids[k][i])
					}
				case op < 10: // time passes: retries come due; sometimes recovery
					d := 300 * time.Millisecond
					if rng.IntN(3) == 0 {
						d = DefaultHeartbeatTimeout + time.Second
					}
					for _, h := range pair {
						h.clock.Advance(d)
					}
				default: // pause or resume
					pause := rng.IntN(2) == 0
					for _, h := range pair {
						require.NoError(t, h.m.UpdatePool(h.ctx, "default", PoolUpdate{Paused: &pause}))
					}
				}
				require.Equal(t, full.itemStates(ids[1]), fast.itemStates(ids[0]), "step %d (op %d)", step, op)
				require.Equal(t, len(full.observe().running), len(fast.observe().running), "slots in use after step %d", step)
			}
			// One org: the plain fast statement starts work; several: the
			// shared one (fair share) does too.
			require.Positive(t, fast.l.fastStarts, "the fast path started work")
			require.Zero(t, full.l.fastStarts)
			for k, h := range pair {
				for i, id := range ids[k] {
					if h.work(id).state != "finished" {
						continue
					}
					n, _ := hookCallsOf(t, h.db, id)
					require.Equal(t, 1, n, "item %d on the %s path: one hook call", i, []string{"fast", "full"}[k])
				}
			}
		})
	}
}

// indexesIn returns the positions in ids of items in state.
func indexesIn(h *harness, ids []uuid.UUID, state string) []int {
	var out []int
	for i, id := range ids {
		if h.work(id).state == state {
			out = append(out, i)
		}
	}
	return out
}

package workpool

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// The fast iteration claims for this replica's executor its share of the
// work it starts (1/replicas, within the executor's free capacity, of the
// handlers registered here) and leaves the rest unclaimed for the others.
func TestFastIterationHandsThisReplicaItsShareAndLeavesTheRestUnclaimed(t *testing.T) {
	cases := []struct {
		name       string
		peers      int // other replicas with live executors
		maxWorkers int
		foreign    int // items of a handler not registered here
		wantLocal  int
	}{
		{name: "alone, it claims everything it starts", peers: 0, maxWorkers: 100, wantLocal: 10},
		{name: "with one other replica, half", peers: 1, maxWorkers: 100, wantLocal: 5},
		{name: "with two other replicas, a third rounded up", peers: 2, maxWorkers: 100, wantLocal: 4},
		{name: "never past its free capacity", peers: 0, maxWorkers: 3, wantLocal: 3},
		{name: "never a handler it does not have", peers: 0, maxWorkers: 100, foreign: 4, wantLocal: 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.MaxWorkers = tc.maxWorkers })
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			h.m.Register("test_handle", func(ctx context.Context, _ Job) (json.RawMessage, error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, nil
			})
			// An executor that takes hand-offs, without its own claim loop.
			h.m.exec.started.Store(true)
			h.runMain() // the term's first (full) iteration: recovery is done
			for i := range tc.peers {
				h.m.peersMu.Lock()
				h.m.peers["peer-"+string(rune('a'+i))] = time.Now()
				h.m.peersMu.Unlock()
			}
			for range 10 - tc.foreign {
				h.enqueue()
			}
			if tc.foreign > 0 {
				// Enqueued through another replica, the only one with the handler.
				other, err := New(h.db, Config{Pools: map[string]int{"default": 10}, Logger: h.m.logger, Now: h.clock.Now})
				require.NoError(t, err)
				other.Register("elsewhere_only", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
				for range tc.foreign {
					_, err := other.Enqueue(h.ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "elsewhere_only", Args: json.RawMessage(`{}`)})
					require.NoError(t, err)
				}
			}

			h.runMain()

			var local, unclaimed, foreignLocal int
			require.NoError(t, h.db.QueryRow(h.ctx, `
				SELECT count(*) FILTER (WHERE claimed_by = $1),
				       count(*) FILTER (WHERE claimed_by IS NULL),
				       count(*) FILTER (WHERE claimed_by = $1 AND handler = 'elsewhere_only')
				FROM workpool_work WHERE pool = 'default' AND state = 'running'`, uuid.UUID(h.m.exec.id)).Scan(&local, &unclaimed, &foreignLocal))
			require.Equal(t, tc.wantLocal, local, "claimed for this replica")
			require.Equal(t, 10-tc.wantLocal, unclaimed, "left for the other replicas' executors")
			require.Zero(t, foreignLocal)
		})
	}
}

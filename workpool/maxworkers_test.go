package workpool

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// MaxWorkers bounds the handlers a replica runs at once across pools: each
// pool's loop hands this replica's executor a share of its starts while
// the executor claims too, all at once; the capacity each of them takes is
// reserved, so together they never take more than there is. (Before, a
// replica leading three pools ran up to three times MaxWorkers handlers.)
func TestMaxWorkersBoundsTheHandlersAReplicaRunsAcrossPools(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	pools := map[string]int{"default": 5, "other": 5, "third": 5}
	const limit = 2
	cfg := Config{Pools: pools, MaxWorkers: limit, HeartbeatTimeout: time.Minute, HeartbeatInterval: 50 * time.Millisecond}
	var peak atomic.Int64
	var ms []*Manager
	for range 2 {
		m := startManager(t, db, cfg)
		var mine atomic.Int64
		m.Register("work", func(context.Context, Job) (json.RawMessage, error) {
			raisePeak(&peak, mine.Add(1))
			time.Sleep(5 * time.Millisecond)
			mine.Add(-1)
			return nil, nil
		})
		ms = append(ms, m)
	}
	var ps []EnqueueParams
	for range 150 {
		for p := range pools {
			ps = append(ps, EnqueueParams{OrgID: "org-1", Pool: p, Handler: "work"})
		}
	}
	_, err := ms[0].EnqueueMany(context.Background(), ps)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE state = 'finished'`).Scan(&done))
		return done == len(ps)
	}, time.Minute, 20*time.Millisecond)
	require.LessOrEqual(t, peak.Load(), int64(limit), "handlers running at once on one replica with MaxWorkers %d", limit)
}

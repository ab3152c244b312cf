package e2e

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// countingSignaler counts the signals a replica's dispatcher sends.
type countingSignaler struct {
	queue.Signaler
	sent atomic.Int64
}

func (c *countingSignaler) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	err := c.Signaler.SignalWorkflow(ctx, workflowID, runID, name, arg)
	if err == nil {
		c.sent.Add(1)
	}
	return err
}

// A finished attempt on a replica that does not lead the pool wakes its
// workflow without the leader: the attempt is recorded, its hook run and
// its signal sent by the replica that ran it, while the leader's loop is
// paused (its pool row is locked, so any iteration blocks at its fence) and
// the leader's dispatcher is stopped.
func TestAWakeFinishedOnAReplicaThatDoesNotLeadArrivesWhileTheLeaderIsPaused(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	ctx := context.Background()
	requireLeads(t, s, "workpool.loop.wakeup")
	require.NoError(t, s.dispatcher.Stop(ctx))

	// Replica B: its own pool manager (which campaigns once, loses, and not
	// again within the test), wake-up service and dispatcher, on the same
	// database. Only B has the handler, so only B's executor runs the work.
	logger := testkit.Logger(t)
	reg := prometheus.NewRegistry()
	bPool, err := workpool.New(s.db, workpool.Config{
		Pools: map[string]int{"default": 10, "wakeup": 10, "single": 1}, LeaderRetry: time.Hour,
		HeartbeatInterval: 200 * time.Millisecond, Logger: logger, Registry: reg,
	})
	require.NoError(t, err)
	started, release := make(chan struct{}, 1), make(chan struct{})
	bPool.Register("onlyOnB", func(ctx context.Context, j workpool.Job) (json.RawMessage, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`"ran on B"`), nil
	})
	bMandates := mandates.New(s.db, mandates.Config{Logger: logger, Registry: reg})
	bSignals := &countingSignaler{Signaler: s.engineTC}
	bDispatcher := queue.NewDispatcher(s.db, bSignals, queue.DispatcherConfig{Logger: logger, Registry: reg})
	bWakeups := wakeup.New(s.db, bPool, bMandates, wakeup.Config{Logger: logger, Registry: reg, Dispatcher: bDispatcher})
	for _, c := range []interface {
		Start(context.Context) error
		Stop(context.Context) error
	}{bPool, bDispatcher} {
		require.NoError(t, c.Start(ctx))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Stop(sctx)
		})
	}

	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	w, err := bWakeups.Create(ctx, wakeup.CreateParams{OrgID: org, AgentID: agent, WorkflowID: wf, Signal: "wake",
		Scope: scope, Cost: 1, RequestedBy: "user-agent", Work: wakeup.Work{Handler: "onlyOnB"}})
	require.NoError(t, err)
	select { // the leader started it; B claimed it and runs it
	case <-started:
	case <-time.After(wait):
		t.Fatal("the work never started on B")
	}

	pause, err := s.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = pause.Rollback(context.WithoutCancel(ctx)) }()
	var genBefore int64
	require.NoError(t, pause.QueryRow(ctx, `SELECT generation FROM workpool_pools WHERE name = 'wakeup' FOR UPDATE`).Scan(&genBefore))
	close(release)

	wakes := s.wakesOf(run)

	require.Len(t, wakes, 1)
	require.Equal(t, w.ID.String(), wakes[0].WakeupID)
	require.Equal(t, "succeeded", wakes[0].Outcome)
	require.JSONEq(t, `"ran on B"`, string(wakes[0].Result))
	var genAfter int64
	require.NoError(t, pause.QueryRow(ctx, `SELECT generation FROM workpool_pools WHERE name = 'wakeup'`).Scan(&genAfter))
	require.Equal(t, genBefore, genAfter, "the leader's loop did not run meanwhile")
	require.EqualValues(t, 1, bSignals.sent.Load(), "B's dispatcher sent the signal")
}

// requireLeads waits until the stack's own replica holds the leadership
// name (the only replica campaigning so far).
func requireLeads(t *testing.T, s *stack, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var held bool
		err := s.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = $1)`, leader.Key(name)).Scan(&held)
		return err == nil && held
	}, wait, pollEvery)
}

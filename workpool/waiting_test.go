package workpool

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// Work started while every executor that runs its handler is full waits,
// unclaimed, for a free worker; its wait is not an executor's silence, and
// recovery must not fail it with an attempt never made. Two replicas of
// one worker each, a pool of four slots, handlers longer than the
// heartbeat timeout, no retries: every item succeeds at its first attempt.
func TestWorkWaitingForAFullExecutorIsNotRecoveredAsSilent(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	cfg := Config{Pools: map[string]int{"default": 4}, MaxWorkers: 1, HeartbeatTimeout: 2 * time.Second}
	var ms []*Manager
	for range 2 {
		m := startManager(t, db, cfg)
		m.Register("slow", func(ctx context.Context, _ Job) (json.RawMessage, error) {
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return json.RawMessage(`"ok"`), nil
		})
		ms = append(ms, m)
	}
	var ids []uuid.UUID
	for range 4 {
		id, err := ms[0].Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "slow"})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		var s Status
		require.Eventually(t, func() bool {
			var err error
			s, err = ms[1].Status(context.Background(), "org-1", id)
			return err == nil && s.State == StateFinished
		}, 30*time.Second, 20*time.Millisecond)
		require.Equal(t, OutcomeSucceeded, s.Outcome, "work %s: error %q after %d attempts", id, s.Error, s.Attempts)
		require.Equal(t, 1, s.Attempts)
	}
}

// Canceled work waiting, unclaimed, for a full executor is not kept alive
// by that executor's heartbeats: no handler runs it to be canceled, and
// recovery finishes it as canceled once its heartbeat timeout passes, its
// slot freed and its hook run. (Heartbeated as waiting work, it stayed
// running for as long as the executor stayed full.) Found by review.
func TestCanceledWorkWaitingForAFullExecutorStillFinishes(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	m := startManager(t, db, Config{Pools: map[string]int{"default": 2}, MaxWorkers: 1, HeartbeatTimeout: time.Second})
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	defer close(release)
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`"ok"`), nil
	})
	ctx := context.Background()
	a, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	select {
	case <-entered:
	case <-time.After(testWait):
		t.Fatal("the first item never ran")
	}
	b, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s, err := m.Status(ctx, "org-1", b)
		return err == nil && s.State == StateRunning
	}, testWait, testTick, "the second item starts, waiting for a worker")
	require.NoError(t, m.Cancel(ctx, "org-1", b))
	requireFinished(t, m, "org-1", b, OutcomeCanceled)
	sa, err := m.Status(ctx, "org-1", a)
	require.NoError(t, err)
	require.Equal(t, StateRunning, sa.State, "the executor stays full")
}

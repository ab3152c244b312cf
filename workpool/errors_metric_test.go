package workpool

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// errorsAt reads reveille_workpool_errors_total for stage.
func errorsAt(m *Manager, stage string) float64 {
	return testutil.ToFloat64(m.metrics.errors.WithLabelValues(stage))
}

// The database gone while work runs shows in reveille_workpool_errors_total,
// not only in WARN lines: the heartbeats fail, and so does recording the
// result of the work that then returns (each retried until it succeeds).
func TestADatabaseOutageShowsInTheWorkpoolsErrorCounter(t *testing.T) {
	t.Parallel()
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	m := startManager(t, db, Config{Pools: map[string]int{"default": 2}, HeartbeatInterval: 50 * time.Millisecond})
	release := make(chan struct{})
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s, err := m.Status(context.Background(), "org-1", id)
		return err == nil && s.State == StateRunning
	}, testWait, testTick, "the work never ran")
	for _, stage := range errorStages {
		require.Zero(t, errorsAt(m, stage), stage)
	}

	relay.Cut()
	close(release)
	require.Eventually(t, func() bool { return errorsAt(m, stageHeartbeat) > 0 && errorsAt(m, stageRecord) > 0 }, testWait, testTick,
		"heartbeat %v, record %v", errorsAt(m, stageHeartbeat), errorsAt(m, stageRecord))
}

// A loop iteration that fails (here: a table it reads is gone for a while)
// is counted, stage "loop", and the loop leads again once it can.
func TestAFailingLoopIterationIsCounted(t *testing.T) {
	t.Parallel()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 2}})
	ctx := context.Background()
	_, err := db.Exec(ctx, `ALTER TABLE workpool_org_queues RENAME TO workpool_org_queues_away`)
	require.NoError(t, err)
	m.kickLoop("default", kickWork)
	require.Eventually(t, func() bool { return errorsAt(m, stageLoop) > 0 }, testWait, testTick)
	_, err = db.Exec(ctx, `ALTER TABLE workpool_org_queues_away RENAME TO workpool_org_queues`)
	require.NoError(t, err)
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
}

// A term whose start fails at the takeover ("taking over the pool's loop
// failed", a WARN line, and the elector campaigns again) is a failure of
// stage "loop" as docs/operations.md describes it ("an iteration or a
// term's start"): the counter must show it.
func TestAFailingTakeoverIsCounted(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	_, err := db.Exec(ctx, `ALTER TABLE workpool_org_turns RENAME TO workpool_org_turns_away`)
	require.NoError(t, err)
	var logs testkit.LogBuffer
	m := startManager(t, db, Config{Pools: map[string]int{"default": 2},
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), "taking over the pool's loop failed") >= 2
	}, testWait, testTick, "the takeover never failed: %s", logs.String())
	require.Positive(t, errorsAt(m, stageLoop), "two terms failed to start (WARN lines), the counter says 0:\n%s", logs.String())
}

// Listing the pools to run loops for fails (here: the pools' table is gone
// for a while): stage "pools" counts it, at the start and at every
// recovery period, where only a WARN line said so.
func TestAFailingListOfPoolsIsCounted(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	m := startManager(t, db, Config{Pools: map[string]int{"default": 2}, RecoveryPeriod: 20 * time.Millisecond})
	require.Zero(t, errorsAt(m, stagePools))
	_, err := db.Exec(ctx, `ALTER TABLE workpool_pools RENAME TO workpool_pools_away`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return errorsAt(m, stagePools) > 0 }, testWait, testTick)
	_, err = db.Exec(ctx, `ALTER TABLE workpool_pools_away RENAME TO workpool_pools`)
	require.NoError(t, err)
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
}

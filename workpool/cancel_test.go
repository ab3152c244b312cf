package workpool

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A cancel of running work reaches the handler through the iteration that
// takes it, not only through the executor's next heartbeat: with heartbeats
// an hour apart, the handler is still stopped and the work finishes
// canceled at once.
func TestACancelOfRunningWorkStopsItsHandlerWithoutWaitingForAHeartbeat(t *testing.T) {
	t.Parallel()
	_, m := newStartedManager(t, Config{HeartbeatTimeout: 2 * time.Hour, HeartbeatInterval: time.Hour, RecoveryPeriod: time.Hour})
	started, stopped := make(chan struct{}), make(chan struct{})
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		close(started)
		<-ctx.Done()
		close(stopped)
		return nil, ctx.Err()
	})
	ctx := context.Background()
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(testWait):
		t.Fatal("the work never started")
	}

	require.NoError(t, m.Cancel(ctx, "org-1", id))

	select {
	case <-stopped:
	case <-time.After(testWait):
		t.Fatal("the canceled work's handler was not stopped")
	}
	requireFinished(t, m, "org-1", id, OutcomeCanceled)
}

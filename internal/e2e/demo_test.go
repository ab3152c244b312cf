package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/demo"
)

// engine demo finds out before its first case whether a worker polls the
// engine's task queue, and with none says so at once, naming the fix:
// its workflows sat in the queue for each case's two minutes, printing
// nothing, before the first case failed.
func TestTheDemoSaysAtOnceWhenNoWorkerPollsItsTaskQueue(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	require.NoError(t, demo.AwaitWorker(ctx, s.tc, s.taskQueue, 30*time.Second), "the stack's worker polls its queue")

	err := demo.AwaitWorker(ctx, s.tc, "e2e-unpolled-"+uuid.NewString(), 500*time.Millisecond)
	require.ErrorContains(t, err, "no worker polls task queue")
	require.ErrorContains(t, err, "--worker")
}

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows"
)

type canChainInput struct {
	Run      int
	Wakes    []workflows.Wake
	Returned []string
}

// canChain is the documented continue-as-new loop: its first run awaits a
// wake and continues as new, handing over what it received and the ids it
// returned; its second run ends.
func canChain(ctx workflow.Context, in canChainInput) ([]string, error) {
	ctx = workflows.HoldReturned(workflows.HoldWakes(ctx, "wake", in.Wakes), in.Returned)
	if in.Run == 0 {
		if _, err := workflows.AwaitWake(ctx, "wake", time.Minute); err != nil {
			return nil, err
		}
		return nil, workflow.NewContinueAsNewError(ctx, "canChain", canChainInput{Run: 1,
			Wakes: workflows.PendingWakes(ctx, "wake"), Returned: workflows.ReturnedIDs(ctx)})
	}
	return in.Returned, nil
}

// A workflow that continues as new names its id only (README, docs/wakeup.md).
// Its first run took the wake, then the chain ended. Should the delivered
// record be lost (as TestASignalResentToAWorkflowItAlreadyWokeIsDelivered
// fakes it), the re-send meets "workflow execution already completed": the
// signal is in the chain's first run's history, not the last one's, and
// the wake-up must not be shown undeliverable.
func TestASignalResentToAContinuedAsNewChainThatTookItIsDelivered(t *testing.T) {
	s := newStack(t, func(o *stackOptions) { o.notFoundGrace = 10 * time.Minute })
	s.fund(10)
	tq := "e2e-can-" + uuid.NewString()
	w := worker.New(s.tc, tq, worker.Options{})
	w.RegisterWorkflowWithOptions(canChain, workflow.RegisterOptions{Name: "canChain"})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	wf := s.workflowID()
	ctx := context.Background()
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: wf, TaskQueue: tq}, "canChain", canChainInput{})
	require.NoError(t, err)
	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{"n": 1}))
	gctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var returned []string
	require.NoError(t, run.Get(gctx, &returned)) // follows the chain to its last run
	require.Equal(t, []string{id}, returned, "the first run took the wake")
	s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })

	// As if the delivered write had never committed: pending and due.
	_, err = s.db.Exec(ctx, `UPDATE queue_messages SET status = 'pending', delivered_at = NULL, next_attempt_at = now(), updated_at = now()
		WHERE org_id = $1 AND queue = 'wakeup' AND idempotency_key = $2`, org, id)
	require.NoError(t, err)
	_, err = s.db.Exec(ctx, `SELECT pg_notify('reveille_queue', '')`)
	require.NoError(t, err)

	got := s.eventually(id, "settled again", func(w map[string]any) bool {
		return w["status"] != "pending" && delivery(w)["attempts"].(float64) >= 2
	})
	require.Equal(t, "delivered", got["status"], "the chain took the signal in its first run: %v", got)
	require.Equal(t, "sent", delivery(got)["state"])
}

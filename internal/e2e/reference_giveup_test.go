package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
)

// The reference workflow gives up on its wake after in.Timeout (or when it
// is canceled). README § workflows: "On either, cancel the wake-up ... so
// its work neither runs nor spends for nothing". Here its spend was refused
// and it waited for a human; it timed out. The approval request it leaves
// pending is still answerable: approving it charges the mandate and runs
// the work of a workflow that is gone, whose signal is then undeliverable.
func TestReferenceWorkflowThatGivesUpOnItsWakeCancelsItsWakeup(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	in := reference.Input{AgentID: agent, Signal: "wake", Scope: scope, Reason: "demo", Cost: 100,
		Work: wakeupWork("echo", `{"hello":"world"}`), Timeout: 500 * time.Millisecond}
	run, err := s.tc.ExecuteWorkflow(context.Background(), clientOptions(s, s.workflowID()), reference.WorkflowName, in)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var res reference.Result
	err = run.Get(ctx, &res)
	require.True(t, workflows.IsTimeout(err), "%v", err)

	// Whatever the workflow left behind settles within a few seconds.
	var w map[string]any
	settled := assertEventually(func() bool {
		r := s.call(http.MethodGet, "/v1/wakeups?limit=10", token(t, org, "admin"), nil)
		items, _ := r.body["items"].([]any)
		if len(items) != 1 {
			return false
		}
		w = items[0].(map[string]any)
		return w["outcome"] != nil
	})
	require.True(t, settled, "the wake-up of a workflow that gave up on it is still open: %v", w)
	require.Equal(t, "canceled", w["outcome"], "%v", w)
}

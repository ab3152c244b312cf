package workflows

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

type carryInput struct {
	First     bool
	Wakes     []Wake     // handed over by the run before
	Decisions []Decision // handed over by the run before
}

// carryWorkflow's first run awaits w1 and continues as new, handing over
// what it received and did not return; its second run awaits w3, w2 and
// the decision on a1, which no one signals again.
func carryWorkflow(ctx workflow.Context, in carryInput) ([]string, error) {
	ctx = HoldDecisions(HoldWakes(ctx, "wake", in.Wakes), in.Decisions)
	if in.First {
		if _, err := AwaitWakeFor(ctx, "wake", "w1", time.Hour); err != nil {
			return nil, err
		}
		// (more signals arrive while no await runs)
		if err := workflow.Sleep(ctx, time.Minute); err != nil {
			return nil, err
		}
		return nil, workflow.NewContinueAsNewError(ctx, carryWorkflow, carryInput{
			Wakes: PendingWakes(ctx, "wake"), Decisions: PendingDecisions(ctx, "")})
	}
	var got []string
	for _, id := range []string{"w3", "w2"} {
		w, err := AwaitWakeFor(ctx, "wake", id, time.Minute)
		if err != nil {
			return got, err
		}
		got = append(got, w.WakeupID)
	}
	d, err := AwaitApproval(ctx, "", "a1", time.Minute)
	if err != nil {
		return got, err
	}
	return append(got, d.ApprovalID+":"+d.Decision), nil
}

// The outbox delivers each wake and decision once, and a run that
// continues as new must drain its channels: what it received and did not
// return — held for a later await (w2, which came while w1 was awaited) or
// still on the channel (w3, a1) — goes to the next run, whose awaits take
// it as if it had just arrived. A repeat of a wake already returned and
// another org's wake stay behind.
func TestWhatARunReceivedAndDidNotReturnGoesToItsNextRun(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/carry"})
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeSucceeded}, time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 2*time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w3", Outcome: OutcomeFailed, Error: "boom"}, 10*time.Second)
	sendDecision(t, env, Decision{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}, 20*time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 30*time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-b", WakeupID: "w9", Outcome: OutcomeSucceeded}, 40*time.Second)

	env.ExecuteWorkflow(carryWorkflow, carryInput{First: true})

	require.True(t, env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var next carryInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	var ids []string
	for _, w := range next.Wakes {
		ids = append(ids, w.WakeupID)
	}
	require.Equal(t, []string{"w2", "w3"}, ids, "held first, then the channel's, in arrival order")
	require.Equal(t, "boom", next.Wakes[1].Error)
	require.Equal(t, []Decision{{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}}, next.Decisions)

	env = suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/carry"})
	env.ExecuteWorkflow(carryWorkflow, next)
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []string{"w3", "w2", "a1:approved"}, got, "each await took its own, nothing signalled again")
}

package workflows

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

// oneChannelWorkflow names one signal, "agent", for its wake-up and its
// tool call (POST /v1/wakeups and POST …/tool-calls both take any name):
// it awaits the wake, then the decision.
func oneChannelWorkflow(ctx workflow.Context) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	w, err := AwaitWakeFor(ctx, "agent", "w1", time.Hour)
	if err != nil {
		return nil, err
	}
	d, err := AwaitApproval(ctx, "agent", "a1", time.Hour)
	if err != nil {
		return []string{w.WakeupID, err.Error()}, nil
	}
	return []string{w.WakeupID, d.ApprovalID + ":" + d.Decision}, nil
}

// The human answers the tool call while the workflow still awaits its
// wake, on the channel both use: the decision must not be lost.
func TestADecisionOnTheChannelOfAnAwaitedWakeIsNotLost(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/one-channel"})
	raw, err := json.Marshal(Decision{OrgID: "org-a", ApprovalID: "a1", ToolName: "git", Decision: DecisionApproved})
	require.NoError(t, err)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow("agent", json.RawMessage(raw)) }, time.Second)
	sendWake(t, env, "agent", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 2*time.Second)

	env.ExecuteWorkflow(oneChannelWorkflow)

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []string{"w1", "a1:approved"}, got)
}

// The other way round: the wake comes while the decision is awaited.
func wakeAfterDecisionWorkflow(ctx workflow.Context) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	d, err := AwaitApproval(ctx, "agent", "a1", time.Hour)
	if err != nil {
		return nil, err
	}
	w, err := AwaitWakeFor(ctx, "agent", "w1", time.Hour)
	if err != nil {
		return []string{d.Decision, err.Error()}, nil
	}
	return []string{d.Decision, w.WakeupID}, nil
}

func TestAWakeOnTheChannelOfAnAwaitedDecisionIsNotLost(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/one-channel"})
	sendWake(t, env, "agent", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, time.Second)
	raw, err := json.Marshal(Decision{OrgID: "org-a", ApprovalID: "a1", ToolName: "git", Decision: DecisionApproved})
	require.NoError(t, err)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow("agent", json.RawMessage(raw)) }, 2*time.Second)

	env.ExecuteWorkflow(wakeAfterDecisionWorkflow)

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []string{"approved", "w1"}, got)
}

// handOverOneChannelWorkflow receives a wake and a decision on the one
// signal it names for both, awaits neither, then hands over what it
// received as a run about to continue as new does.
func handOverOneChannelWorkflow(ctx workflow.Context, decisionsFirst bool) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	if err := workflow.Sleep(ctx, time.Minute); err != nil {
		return nil, err
	}
	var wakes []Wake
	var decisions []Decision
	if decisionsFirst {
		decisions = PendingDecisions(ctx, "agent")
		wakes = PendingWakes(ctx, "agent")
	} else {
		wakes = PendingWakes(ctx, "agent")
		decisions = PendingDecisions(ctx, "agent")
	}
	var got []string
	for _, w := range wakes {
		got = append(got, "wake:"+w.WakeupID)
	}
	for _, d := range decisions {
		got = append(got, "decision:"+d.ApprovalID)
	}
	return got, nil
}

// A run that continues as new hands over both kinds from one channel,
// whichever it drains first: the first drain took the other kind off the
// channel and dropped it.
func TestARunHandsOverTheWakesAndDecisionsOfOneChannel(t *testing.T) {
	for _, decisionsFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "wakes first", true: "decisions first"}[decisionsFirst], func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/one-channel"})
			sendWake(t, env, "agent", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, time.Second)
			raw, err := json.Marshal(Decision{OrgID: "org-a", ApprovalID: "a1", ToolName: "git", Decision: DecisionApproved})
			require.NoError(t, err)
			env.RegisterDelayedCallback(func() { env.SignalWorkflow("agent", json.RawMessage(raw)) }, 2*time.Second)

			env.ExecuteWorkflow(handOverOneChannelWorkflow, decisionsFirst)

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got []string
			require.NoError(t, env.GetWorkflowResult(&got))
			require.Equal(t, []string{"wake:w1", "decision:a1"}, got)
		})
	}
}

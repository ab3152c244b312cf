package workflows

import (
	"errors"
	"fmt"
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

type loopInput struct {
	Run      int
	Wakes    []Wake
	Returned []string
}

// loopWorkflow is the documented continue-as-new loop: each run awaits the
// next wake (of any wake-up) and continues as new, handing over what it
// received and did not return, and the ids it returned.
func loopWorkflow(ctx workflow.Context, in loopInput) (string, error) {
	ctx = HoldReturned(HoldWakes(ctx, "wake", in.Wakes), in.Returned)
	w, err := AwaitWake(ctx, "wake", time.Hour)
	if err != nil {
		return "", err
	}
	if in.Run == 0 {
		return "", workflow.NewContinueAsNewError(ctx, loopWorkflow,
			loopInput{Run: 1, Wakes: PendingWakes(ctx, "wake"), Returned: ReturnedIDs(ctx)})
	}
	return w.WakeupID, nil
}

// Delivery is at least once: a send that timed out after Temporal took it
// is sent again, and the retry reaches whatever run is current by then. A
// wake the previous run returned is not returned again by the next run as
// if it were new: the ids returned travel with the run's input
// (ReturnedIDs, HoldReturned). Without them the next run acted on w1 twice.
func TestAWakeTheLastRunReturnedIsNotReturnedAgainAfterContinueAsNew(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/loop"})
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, time.Second)
	env.ExecuteWorkflow(loopWorkflow, loopInput{})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var next loopInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.Equal(t, []string{"w1"}, next.Returned)

	// the next run: the dispatcher's repeat of w1 lands, then w2
	env = suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/loop"})
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeFailed}, 2*time.Second)
	env.ExecuteWorkflow(loopWorkflow, next)
	require.NoError(t, env.GetWorkflowError())
	var got string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, "w2", got, "the repeat of w1 was returned again as a new wake")
}

// ReturnedIDs hands over the maxCarriedReturned ids of each kind returned
// last, in the order returned: a loop that continues as new for ever does
// not carry every id it ever returned.
func TestReturnedIDsKeepsTheLastReturnedOfEachKind(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	var ids []string
	for i := range maxCarriedReturned + 5 {
		ids = append(ids, fmt.Sprintf("0190a5c4-%04d", i), fmt.Sprintf("approval:0190a5c4-%04d", i))
	}
	env.ExecuteWorkflow(func(ctx workflow.Context) ([]string, error) {
		return ReturnedIDs(HoldReturned(ctx, ids)), nil
	})
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Len(t, got, 2*maxCarriedReturned)
	require.Equal(t, "0190a5c4-0005", got[0], "the wake-up ids returned first are dropped")
	require.Equal(t, fmt.Sprintf("0190a5c4-%04d", maxCarriedReturned+4), got[maxCarriedReturned-1])
	require.Equal(t, "approval:0190a5c4-0005", got[maxCarriedReturned])
}

// ReturnedIDs bounded what it handed over by the ids' creation order, not
// by when the run returned them. A wake-up created long ago — its
// spend awaited a human for a day, or its work retried for hours — is
// resolved and returned after many younger wake-ups were: its id is the
// oldest the loop carries, and it was the one dropped. The outbox's repeat
// of that wake (a send whose outcome it did not learn, retried within
// minutes) then reached the next run, which returned it as a new wake.
func TestALateResolvedOldWakeupIsNotReturnedAgainAfterContinueAsNew(t *testing.T) {
	// UUIDv7s: the slow wake-up was created before the 1,000 quick ones
	// the loop's earlier runs returned and handed over.
	slow := "0190a5c4-0000-7000-8000-000000000000"
	var returned []string
	for i := range maxCarriedReturned {
		returned = append(returned, fmt.Sprintf("0190a5c5-%04d-7000-8000-000000000000", i))
	}
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/loop"})
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: slow, Outcome: OutcomeSucceeded}, time.Second)
	env.ExecuteWorkflow(loopWorkflow, loopInput{Returned: returned})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "%v", env.GetWorkflowError())
	var next loopInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))

	// the next run: the dispatcher's repeat of the slow wake lands, then a new one
	fresh := "0190a5c6-0000-7000-8000-000000000000"
	env = suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/loop"})
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: slow, Outcome: OutcomeSucceeded}, time.Second)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: fresh, Outcome: OutcomeSucceeded}, 2*time.Second)
	env.ExecuteWorkflow(loopWorkflow, next)
	require.NoError(t, env.GetWorkflowError())
	var got string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, fresh, got, "the repeat of the wake the last run returned was returned again as a new wake")
}

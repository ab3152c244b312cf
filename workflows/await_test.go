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

// These run AwaitWake's selection logic in the SDK's workflow test
// environment (deterministic, no server); the e2e package runs it against
// a real Temporal server.

type awaitInput struct {
	WakeupID string // "" : AwaitWake, else AwaitWakeFor this id
}

func awaitWorkflow(ctx workflow.Context, in awaitInput) (Wake, error) {
	ctx = WithWakeDedupe(ctx)
	if in.WakeupID == "" {
		return AwaitWake(ctx, "wake", time.Hour)
	}
	return AwaitWakeFor(ctx, "wake", in.WakeupID, time.Hour)
}

func TestAwaitWakeTakesTheFirstWakeOfItsOrgAndAwaitWakeForOnlyItsOwn(t *testing.T) {
	wakes := []Wake{
		{OrgID: "org-b", WakeupID: "w0", Outcome: "succeeded"}, // another org's
		{OrgID: "org-a", WakeupID: "w1", Outcome: "failed"},    // another wake-up's
		{OrgID: "org-a", WakeupID: "w2", Outcome: "succeeded"},
	}
	cases := []struct {
		name string
		in   awaitInput
		want string
	}{
		{name: "any wake-up of the workflow's org", in: awaitInput{}, want: "w1"},
		{name: "only the awaited wake-up", in: awaitInput{WakeupID: "w2"}, want: "w2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/await-test"})
			for i, w := range wakes {
				raw, err := json.Marshal(w)
				require.NoError(t, err)
				env.RegisterDelayedCallback(func() { env.SignalWorkflow("wake", json.RawMessage(raw)) }, time.Duration(i+1)*time.Second)
			}

			env.ExecuteWorkflow(awaitWorkflow, tc.in)

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got Wake
			require.NoError(t, env.GetWorkflowResult(&got))
			require.Equal(t, tc.want, got.WakeupID)
		})
	}
}

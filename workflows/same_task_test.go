package workflows

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"
)

// A wake (or decision) recorded in the history before the await's timer
// fired is the await's answer, also when both reach the workflow in one
// workflow task — as they do whenever its worker was away (a deploy, a
// crash, a backlog) across the deadline: the signal came at 30 s, the
// timer fired at 60 s, and the worker got both at once. The await without
// WithWakeDedupe returns it; the shared wait (WithWakeDedupe, what the
// docs recommend) returned ErrTimeout, so the example workflow canceled a
// wake-up that had already succeeded and failed with the result in hand.
func TestASignalRecordedBeforeTheTimeoutIsReturnedWhenBothComeInOneTask(t *testing.T) {
	for _, approval := range []bool{false, true} {
		for _, dedupe := range []bool{false, true} {
			name := map[bool]string{false: "wake", true: "approval"}[approval] +
				map[bool]string{false: "/own-wait", true: "/shared-wait"}[dedupe]
			t.Run(name, func(t *testing.T) {
				var suite testsuite.WorkflowTestSuite
				env := suite.NewTestWorkflowEnvironment()
				env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/same-task"})
				sig, payload := "wake", any(Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded})
				if approval {
					sig, payload = ApprovalSignal, Decision{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}
				}
				raw, err := json.Marshal(payload)
				require.NoError(t, err)
				// Recorded at 30 s; no workflow task runs until the timer
				// fires at 60 s (the worker was away).
				env.RegisterDelayedCallback(func() { env.SignalWorkflowSkippingWorkflowTask(sig, json.RawMessage(raw)) }, 30*time.Second)

				// (awaitPastAnUndecodableSignal awaits w1 or a1 for a minute)
				env.ExecuteWorkflow(awaitPastAnUndecodableSignal, undecodableInput{Dedupe: dedupe, Approval: approval})

				require.True(t, env.IsWorkflowCompleted())
				require.NoError(t, env.GetWorkflowError(), "the signal came 30 s before the deadline")
				var got string
				require.NoError(t, env.GetWorkflowResult(&got))
				require.Equal(t, map[bool]string{false: "w1", true: "a1"}[approval], got)
			})
		}
	}
}

package workflows

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

type parallelWaitsInput struct {
	IDs       []string
	Approvals bool
	Timeout   time.Duration
}

// parallelWaitsWorkflow awaits each id in a coroutine of its own, all at
// once, as a workflow that created two wake-ups (or asked for two tool
// calls) and handles each as it resolves does. The histories in testdata
// were recorded by this very function built against the code before the
// shared wait state: keep it as it is, or they no longer replay.
func parallelWaitsWorkflow(ctx workflow.Context, in parallelWaitsInput) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	got := make([]string, len(in.IDs))
	wg := workflow.NewWaitGroup(ctx)
	for i, id := range in.IDs {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			var outcome string
			var err error
			if in.Approvals {
				var d Decision
				d, err = AwaitApproval(ctx, "", id, in.Timeout)
				outcome = d.Decision
			} else {
				var w Wake
				w, err = AwaitWakeFor(ctx, "wake", id, in.Timeout)
				outcome = w.Outcome
			}
			switch {
			case errors.Is(err, ErrTimeout), errors.Is(err, ErrApprovalTimeout):
				got[i] = id + ":timeout"
			case err != nil:
				got[i] = id + ":error"
			default:
				got[i] = id + ":" + outcome
			}
		})
	}
	wg.Wait(ctx)
	return got, nil
}

type sentSignal struct {
	name    string
	payload any
}

// Awaits in parallel coroutines share one WithWakeDedupe context: each
// gets its own wake or decision whatever order they arrive in. (They used
// to take each other's from the channel, hold it where the other await no
// longer looked, and both time out.)
func TestParallelAwaitsEachGetTheirOwnSignal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      parallelWaitsInput
		signals []sentSignal
		want    []string
	}{
		{
			name: "wakes in the opposite order",
			in:   parallelWaitsInput{IDs: []string{"w1", "w2"}, Timeout: time.Hour},
			signals: []sentSignal{
				{"wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeSucceeded}},
				{"wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeFailed}},
			},
			want: []string{"w1:failed", "w2:succeeded"},
		},
		{
			name: "decisions in the opposite order",
			in:   parallelWaitsInput{IDs: []string{"a1", "a2"}, Approvals: true, Timeout: time.Hour},
			signals: []sentSignal{
				{ApprovalSignal, Decision{OrgID: "org-a", ApprovalID: "a2", ToolName: "shell", Decision: DecisionDenied}},
				{ApprovalSignal, Decision{OrgID: "org-a", ApprovalID: "a1", ToolName: "git", Decision: DecisionApproved}},
			},
			want: []string{"a1:approved", "a2:denied"},
		},
		{
			name: "repeats, other orgs and a malformed signal are passed over",
			in:   parallelWaitsInput{IDs: []string{"w1", "w2", "w3"}, Timeout: time.Hour},
			signals: []sentSignal{
				{"wake", Wake{OrgID: "org-a", WakeupID: "w3", Outcome: OutcomeCanceled}},
				{"wake", map[string]string{"wakeup_id": "w1"}}, // no outcome: malformed
				{"wake", Wake{OrgID: "org-b", WakeupID: "w1", Outcome: OutcomeSucceeded}},
				{"wake", Wake{OrgID: "org-a", WakeupID: "w3", Outcome: OutcomeSucceeded}}, // a repeated delivery (forged)
				{"wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeDenied}},
				{"wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeFailed}},
			},
			want: []string{"w1:failed", "w2:denied", "w3:canceled"},
		},
		{
			name: "one that never comes times out alone",
			in:   parallelWaitsInput{IDs: []string{"w1", "w2"}, Timeout: time.Minute},
			signals: []sentSignal{
				{"wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeSucceeded}},
			},
			want: []string{"w1:timeout", "w2:succeeded"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/parallel-test"})
			for i, s := range tc.signals {
				raw, err := json.Marshal(s.payload)
				require.NoError(t, err)
				env.RegisterDelayedCallback(func() { env.SignalWorkflow(s.name, json.RawMessage(raw)) }, time.Duration(i+1)*time.Second)
			}

			env.ExecuteWorkflow(parallelWaitsWorkflow, tc.in)

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got []string
			require.NoError(t, env.GetWorkflowResult(&got))
			require.Equal(t, tc.want, got)
		})
	}
}

// cancelOneWorkflow awaits w1 and w2 in parallel and cancels w1's await
// first: the reader both share keeps running for w2's.
func cancelOneWorkflow(ctx workflow.Context) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	c1, cancel1 := workflow.WithCancel(ctx)
	got := make([]string, 2)
	wg := workflow.NewWaitGroup(ctx)
	for i, c := range []workflow.Context{c1, ctx} {
		wg.Add(1)
		workflow.Go(c, func(c workflow.Context) {
			defer wg.Done()
			w, err := AwaitWakeFor(c, "wake", []string{"w1", "w2"}[i], time.Hour)
			got[i] = w.WakeupID
			if err != nil {
				got[i] = err.Error()
			}
		})
	}
	_ = workflow.Sleep(ctx, time.Second)
	cancel1()
	wg.Wait(ctx)
	// A wake arriving while nobody awaits stays on the channel (it is no
	// one's yet); the next await takes it.
	_ = workflow.Sleep(ctx, time.Minute)
	w, err := AwaitWake(ctx, "wake", time.Hour)
	if err != nil {
		return nil, err
	}
	return append(got, w.WakeupID), nil
}

func TestCancelingOneParallelAwaitLeavesTheOthersWaiting(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/cancel-test"})
	for i, id := range []string{"w2", "w3"} {
		raw, err := json.Marshal(Wake{OrgID: "org-a", WakeupID: id, Outcome: OutcomeSucceeded})
		require.NoError(t, err)
		env.RegisterDelayedCallback(func() { env.SignalWorkflow("wake", json.RawMessage(raw)) }, time.Duration(i+1)*10*time.Second)
	}

	env.ExecuteWorkflow(cancelOneWorkflow)

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []string{"canceled", "w2", "w3"}, got)
}

// Recorded histories replay on the current code. A workflow parked under
// the code before the shared wait state has no version marker in its
// history: an upgraded worker must keep waiting the old way for it
// (DefaultVersion) or its replay fails as nondeterministic (the held-wake
// one does without the gate). Both parallel awaits timed out then — the
// bug the shared state fixes — and must replay so. The "shared-state"
// ones guard the new way's commands against later changes. Each was
// recorded from a Temporal dev server running parallelWaitsWorkflow as
// workflow "org-a/<name>", built against the code of its time.
func TestRecordedHistoriesStillReplay(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"parallel-wakes-default-version", []string{"w1:timeout", "w2:timeout"}},
		{"parallel-approvals-default-version", []string{"a1:timeout", "a2:timeout"}},
		{"single-wake-held-default-version", []string{"w1:succeeded"}}, // w2's wake came first, and was held
		{"parallel-wakes-shared-state", []string{"w1:failed", "w2:succeeded"}},
		{"parallel-approvals-shared-state", []string{"a1:approved", "a2:denied"}},
		{"single-wake-held-shared-state", []string{"w1:succeeded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tc.name+".json"))
			require.NoError(t, err)
			defer f.Close()
			hist, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
			require.NoError(t, err)
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(parallelWaitsWorkflow)
			// The original id: the org the awaits accept is its prefix.
			id := "org-a/" + tc.name
			require.NoError(t, r.ReplayWorkflowHistoryWithOptions(nil, hist,
				worker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: id}}))
			// What the old code returned, as recorded (the replayer checks
			// the commands, not the result).
			last := hist.Events[len(hist.Events)-1].GetWorkflowExecutionCompletedEventAttributes()
			var got []string
			require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(last.GetResult(), &got))
			require.Equal(t, tc.want, got)
		})
	}
}

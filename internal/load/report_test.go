package load

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows"
)

// runParked runs the load's workflow in the SDK's test environment with
// the signals send registers, and returns what it reported.
func runParked(t *testing.T, in workflowInput, send func(env *testsuite.TestWorkflowEnvironment, signal func(string, any))) woken {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	var got woken
	report := func(_ context.Context, w woken) error { got = w; return nil }
	env.RegisterWorkflowWithOptions(parkedWorkflow(report), workflow.RegisterOptions{Name: WorkflowName})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org/load-x-1"})
	send(env, func(name string, v any) {
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		env.SignalWorkflow(name, json.RawMessage(raw))
	})
	env.ExecuteWorkflow(WorkflowName, in)
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	return got
}

// A wake delivered twice (delivery is at least once), both deliveries in
// the workflow task that wakes it, is ignored by the workflow and is
// counted in duplicates_deduped.
func TestARepeatedWakeIsCountedAsADuplicate(t *testing.T) {
	w := workflows.Wake{OrgID: "org", WakeupID: "w1", Outcome: "succeeded"}
	got := runParked(t, workflowInput{Timeout: time.Minute}, func(env *testsuite.TestWorkflowEnvironment, signal func(string, any)) {
		env.RegisterDelayedCallback(func() { signal(wakeSignal, w); signal(wakeSignal, w) }, 0)
	})
	require.Equal(t, "w1", got.WakeupID)
	require.Equal(t, 1, got.Duplicates, "the repeated delivery the workflow ignored")
}

// A wake-up whose workflow woke only after --deadline is lost (docs: "a
// wake-up whose workflow has not woken --deadline after it is lost, and
// the command exits 1"), whether or not the run was still going when it
// finally woke.
func TestAWakeLaterThanTheDeadlineCountsAsLost(t *testing.T) {
	rc := newRecorder()
	e := rc.expect("org/wf", kind{})
	rc.accepted(e, "")
	e.accepted = e.accepted.Add(-3 * time.Minute) // settled 3 min ago
	require.NoError(t, rc.woke(t.Context(), woken{WorkflowID: "org/wf", Outcome: "succeeded"}))
	rep := rc.summary(time.Hour, 2*time.Minute)
	require.Equal(t, 1, rep.Lost, "woke past its deadline")
	require.Equal(t, 0, rep.Woken)
}

// p99 over two wake-ups of 1 ms and 100 ms is 100 ms (nearest rank, as
// engine bench's wakePct computes it), not the faster one.
func TestTheP99OfASmallRunIsNotItsFastestWakeup(t *testing.T) {
	rc := newRecorder()
	for i, lat := range []time.Duration{time.Millisecond, 100 * time.Millisecond} {
		wf := "org/wf-" + string(rune('a'+i))
		e := rc.expect(wf, kind{})
		rc.accepted(e, "")
		require.NoError(t, rc.woke(t.Context(), woken{WorkflowID: wf, Outcome: "succeeded"}))
		rc.mu.Lock()
		e.wokenAt = e.accepted.Add(lat)
		rc.mu.Unlock()
	}
	rep := rc.summary(time.Second, time.Minute)
	require.Equal(t, 100*time.Millisecond, rep.Max)
	require.Equal(t, 100*time.Millisecond, rep.P99, "p99 of {1ms, 100ms}")
}

// A workflow woken with another wake-up than the one its request created
// (a second wake-up made for the same request) is a wrong outcome, not a
// wake; the wake of its own is fine.
func TestAWakeOfAnotherWakeupIsAWrongOutcome(t *testing.T) {
	rc := newRecorder()
	for _, w := range []struct{ wf, created, woke string }{
		{"org/wf-1", "w-1", "w-1"},
		{"org/wf-2", "w-2", "w-2-second"},
	} {
		e := rc.expect(w.wf, kind{})
		rc.accepted(e, w.created)
		require.NoError(t, rc.woke(t.Context(), woken{WorkflowID: w.wf, WakeupID: w.woke, Outcome: "succeeded"}))
	}
	rep := rc.summary(time.Second, time.Minute)
	require.Equal(t, 2, rep.Woken)
	require.Equal(t, 1, rep.WrongOutcomes, "the other wake-up's wake")
}

// A second wake-up's wake buffered with the workflow's own (two wake-ups
// created for one request: what the run exists to catch) is drained by
// the workflow and reported nowhere: not as a duplicate, not as a wrong
// outcome. The run reports woken=1, wrong_outcomes=0 and exits 0.
func TestASecondWakeupsWakeBufferedWithItsOwnIsNotHidden(t *testing.T) {
	own := workflows.Wake{OrgID: "org", WakeupID: "w-1", Outcome: "succeeded"}
	other := workflows.Wake{OrgID: "org", WakeupID: "w-1-second", Outcome: "succeeded"}
	got := runParked(t, workflowInput{Timeout: time.Minute}, func(env *testsuite.TestWorkflowEnvironment, signal func(string, any)) {
		env.RegisterDelayedCallback(func() { signal(wakeSignal, own); signal(wakeSignal, other) }, 0)
	})
	rc := newRecorder()
	e := rc.expect(got.WorkflowID, kind{})
	rc.accepted(e, "w-1")
	require.NoError(t, rc.woke(t.Context(), got))
	rep := rc.summary(time.Second, time.Minute)
	require.Equal(t, 1, rep.Woken)
	require.Equal(t, 1, rep.WrongOutcomes, "the workflow also got the wake of another wake-up for its request")
}

package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/types/known/durationpb"
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

type awaitApprovalsInput struct {
	ApprovalIDs []string
}

// awaitApprovalsWorkflow awaits each approval in turn, as a workflow that
// asked for two tool calls at once does.
func awaitApprovalsWorkflow(ctx workflow.Context, in awaitApprovalsInput) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	var out []string
	for _, id := range in.ApprovalIDs {
		d, err := AwaitApproval(ctx, "", id, time.Hour)
		if err != nil {
			return out, err
		}
		out = append(out, d.ApprovalID+":"+d.Decision)
	}
	return out, nil
}

// A decision that arrives while the workflow awaits another approval is
// not for that call, but it is not lost either: the later AwaitApproval
// for it returns it (the outbox delivers it once, so dropping it would
// park that call until its timeout). Repeats and other orgs' stay ignored.
func TestAwaitApprovalKeepsADecisionThatArrivesBeforeItIsAwaited(t *testing.T) {
	decisions := []Decision{
		{OrgID: "org-a", ApprovalID: "a2", ToolName: "shell", Decision: DecisionDenied},   // answered first
		{OrgID: "org-b", ApprovalID: "a2", ToolName: "shell", Decision: DecisionApproved}, // another org's
		{OrgID: "org-a", ApprovalID: "a2", ToolName: "shell", Decision: DecisionApproved}, // a repeated delivery (forged)
		{OrgID: "org-a", ApprovalID: "a1", ToolName: "git", Decision: DecisionApproved},
	}
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/await-approvals-test"})
	for i, d := range decisions {
		raw, err := json.Marshal(d)
		require.NoError(t, err)
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(ApprovalSignal, json.RawMessage(raw)) }, time.Duration(i+1)*time.Second)
	}

	env.ExecuteWorkflow(awaitApprovalsWorkflow, awaitApprovalsInput{ApprovalIDs: []string{"a1", "a2"}})

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var got []string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []string{"a1:approved", "a2:denied"}, got)
}

type awaitWakesInput struct {
	WakeupIDs []string // "" : AwaitWake, else AwaitWakeFor this id
}

// awaitWakesWorkflow awaits each wake-up in turn, as a workflow that
// created two wake-ups does.
func awaitWakesWorkflow(ctx workflow.Context, in awaitWakesInput) ([]string, error) {
	ctx = WithWakeDedupe(ctx)
	var out []string
	for _, id := range in.WakeupIDs {
		var w Wake
		var err error
		if id == "" {
			w, err = AwaitWake(ctx, "wake", time.Hour)
		} else {
			w, err = AwaitWakeFor(ctx, "wake", id, time.Hour)
		}
		if err != nil {
			return out, err
		}
		out = append(out, w.WakeupID+":"+w.Outcome)
	}
	return out, nil
}

// A wake that arrives while the workflow awaits another wake-up is not
// lost: the later await for it returns it at once (the outbox delivers
// each wake once, so dropping it would park that await until its
// timeout). Repeats and other orgs' stay ignored, and a wake held on one
// signal is not handed to an await on another.
func TestAwaitWakeForKeepsAWakeThatArrivesBeforeItIsAwaited(t *testing.T) {
	wakes := []struct {
		signal string
		wake   Wake
	}{
		{"wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeFailed}},     // resolved first
		{"wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeSucceeded}},  // a repeated delivery (forged)
		{"other", Wake{OrgID: "org-a", WakeupID: "w3", Outcome: OutcomeSucceeded}}, // another signal's: never ours
		{"wake", Wake{OrgID: "org-b", WakeupID: "w1", Outcome: OutcomeSucceeded}},  // another org's
		{"wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}},
		{"wake", Wake{OrgID: "org-a", WakeupID: "w3", Outcome: OutcomeCanceled}},
	}
	for _, tc := range []struct {
		name string
		in   []string
		want []string
	}{
		{"in the other order", []string{"w1", "w2", "w3"}, []string{"w1:succeeded", "w2:failed", "w3:canceled"}},
		{"then any wake-up takes the oldest held", []string{"w1", "", ""}, []string{"w1:succeeded", "w2:failed", "w3:canceled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/await-wakes-test"})
			for i, w := range wakes {
				raw, err := json.Marshal(w.wake)
				require.NoError(t, err)
				env.RegisterDelayedCallback(func() { env.SignalWorkflow(w.signal, json.RawMessage(raw)) }, time.Duration(i+1)*time.Second)
			}

			env.ExecuteWorkflow(awaitWakesWorkflow, awaitWakesInput{WakeupIDs: tc.in})

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got []string
			require.NoError(t, env.GetWorkflowResult(&got))
			require.Equal(t, tc.want, got)
		})
	}
}

type oneApprovalResult struct {
	Decision string
	Approved bool
}

// oneApprovalWorkflow awaits approval a1, with or without WithWakeDedupe.
func oneApprovalWorkflow(ctx workflow.Context, dedupe bool) (oneApprovalResult, error) {
	if dedupe {
		ctx = WithWakeDedupe(ctx)
	}
	d, err := AwaitApproval(ctx, "", "a1", time.Hour)
	return oneApprovalResult{d.Decision, d.Approved()}, err
}

// A decision other than approved or denied (a newer server's) is the
// answer all the same: it is returned, and it is not an approval. It was
// dropped as malformed, parking the workflow until its timeout.
func TestAwaitApprovalReturnsADecisionItDoesNotKnowAsNotApproved(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload map[string]any
		want    oneApprovalResult
	}{
		{"approved", map[string]any{"decision": "approved"}, oneApprovalResult{"approved", true}},
		{"denied", map[string]any{"decision": "denied"}, oneApprovalResult{"denied", false}},
		{"a newer server's value, with fields of its own", map[string]any{"decision": "canceled", "source": "system", "new_field": 1}, oneApprovalResult{"canceled", false}},
	} {
		for _, dedupe := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/dedupe=%v", tc.name, dedupe), func(t *testing.T) {
				var suite testsuite.WorkflowTestSuite
				env := suite.NewTestWorkflowEnvironment()
				env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/decision-test"})
				payload := map[string]any{"org_id": "org-a", "approval_id": "a1", "tool_name": "shell"}
				maps.Copy(payload, tc.payload)
				raw, err := json.Marshal(payload)
				require.NoError(t, err)
				env.RegisterDelayedCallback(func() { env.SignalWorkflow(ApprovalSignal, json.RawMessage(raw)) }, time.Second)

				env.ExecuteWorkflow(oneApprovalWorkflow, dedupe)

				require.True(t, env.IsWorkflowCompleted())
				require.NoError(t, env.GetWorkflowError())
				var got oneApprovalResult
				require.NoError(t, env.GetWorkflowResult(&got))
				require.Equal(t, tc.want, got)
			})
		}
	}
}

// A decision that names no approval or no decision is still malformed:
// skipped, and the await goes on to the next signal.
func TestAwaitApprovalSkipsADecisionWithoutApprovalOrDecision(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/decision-test"})
	for i, p := range []map[string]any{
		{"org_id": "org-a", "approval_id": "a1"},                       // no decision
		{"org_id": "org-a", "decision": "approved"},                    // no approval
		{"org_id": "org-a", "approval_id": "a1", "decision": "denied"}, // the answer
	} {
		raw, err := json.Marshal(p)
		require.NoError(t, err)
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(ApprovalSignal, json.RawMessage(raw)) }, time.Duration(i+1)*time.Second)
	}

	env.ExecuteWorkflow(oneApprovalWorkflow, false)

	require.NoError(t, env.GetWorkflowError())
	var got oneApprovalResult
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, oneApprovalResult{"denied", false}, got)
}

type argsInput struct {
	Call    string // AwaitWake, AwaitWakeFor, AwaitApproval
	Signal  string
	Timeout time.Duration
	NoID    bool // AwaitWakeFor and AwaitApproval: an empty id instead of w1, a1
}

func argsWorkflow(ctx workflow.Context, in argsInput) (string, error) {
	wakeupID, approvalID := "w1", "a1"
	if in.NoID {
		wakeupID, approvalID = "", ""
	}
	switch in.Call {
	case "AwaitWake":
		w, err := AwaitWake(ctx, in.Signal, in.Timeout)
		return w.WakeupID, err
	case "AwaitWakeFor":
		w, err := AwaitWakeFor(ctx, in.Signal, wakeupID, in.Timeout)
		return w.WakeupID, err
	default:
		d, err := AwaitApproval(ctx, in.Signal, approvalID, in.Timeout)
		return d.ApprovalID, err
	}
}

// An empty signal name (no wake ever arrives on it: a wake-up always
// names one) and a negative timeout (once silently no limit) are errors
// at once, not a wait for good; AwaitApproval's empty name is
// ApprovalSignal, as documented.
func TestAwaitRefusesAnEmptySignalNameAndANegativeTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      argsInput
		wantErr string // "": the signal sent is returned
	}{
		{"AwaitWake with no signal name", argsInput{"AwaitWake", "", time.Hour, false}, "AwaitWake: the signal name is empty"},
		{"AwaitWakeFor with no signal name", argsInput{"AwaitWakeFor", "", 0, false}, "AwaitWakeFor: the signal name is empty"},
		{"AwaitWake with a negative timeout", argsInput{"AwaitWake", "wake", -time.Second, false}, "AwaitWake: negative timeout -1s"},
		{"AwaitWakeFor with a negative timeout", argsInput{"AwaitWakeFor", "wake", -time.Second, false}, "AwaitWakeFor: negative timeout -1s"},
		{"AwaitApproval with a negative timeout", argsInput{"AwaitApproval", "", -time.Second, false}, "AwaitApproval: negative timeout -1s"},
		{"AwaitApproval with no signal name waits on approval", argsInput{"AwaitApproval", "", 0, false}, ""},
		{"a zero timeout waits without limit", argsInput{"AwaitWakeFor", "wake", 0, false}, ""},
		// (an empty id took any wake-up's wake as the one awaited, or waited
		// for good: no decision is without its approval id)
		{"AwaitWakeFor with no wake-up id", argsInput{"AwaitWakeFor", "wake", time.Hour, true}, "AwaitWakeFor: the wake-up id is empty"},
		{"AwaitApproval with no approval id", argsInput{"AwaitApproval", "", 0, true}, "AwaitApproval: the approval id is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/args-test"})
			// Long after any default timeout of the test environment's.
			at := 48 * time.Hour
			sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, at)
			sendDecision(t, env, Decision{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}, at)

			env.ExecuteWorkflow(argsWorkflow, tc.in)

			require.True(t, env.IsWorkflowCompleted())
			if tc.wantErr != "" {
				require.ErrorContains(t, env.GetWorkflowError(), tc.wantErr)
				return
			}
			require.NoError(t, env.GetWorkflowError())
		})
	}
}

// A workflow whose history began before the empty-id check (no marker)
// keeps what an empty wake-up id meant then: any wake-up's wake.
func TestAwaitKeepsAnEmptyWakeupIDAsAnyInAnOlderHistory(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/args-test"})
	env.OnGetVersion(emptyIDCheckChange, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, time.Second)

	env.ExecuteWorkflow(argsWorkflow, argsInput{"AwaitWakeFor", "wake", time.Hour, true})

	require.NoError(t, env.GetWorkflowError())
	var got string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, "w1", got)
}

// A workflow whose history began before the check (no marker) keeps what
// these arguments meant then, so that it replays: a negative timeout waits
// without limit.
func TestAwaitKeepsANegativeTimeoutAsNoLimitInAnOlderHistory(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/args-test"})
	env.OnGetVersion(argumentCheckChange, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
	sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 48*time.Hour)

	env.ExecuteWorkflow(argsWorkflow, argsInput{"AwaitWakeFor", "wake", -time.Second, false})

	require.NoError(t, env.GetWorkflowError())
	var got string
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, "w1", got)
}

func sendWake(t *testing.T, env *testsuite.TestWorkflowEnvironment, signal string, w Wake, at time.Duration) {
	t.Helper()
	raw, err := json.Marshal(w)
	require.NoError(t, err)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(signal, json.RawMessage(raw)) }, at)
}

func sendDecision(t *testing.T, env *testsuite.TestWorkflowEnvironment, d Decision, at time.Duration) {
	t.Helper()
	raw, err := json.Marshal(d)
	require.NoError(t, err)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(ApprovalSignal, json.RawMessage(raw)) }, at)
}

// logRecord is a log line a test workflow wrote.
type logRecord struct {
	level, msg string
	kv         map[string]any
}

// recordingLogger keeps the lines at Info and above (log.Logger).
type recordingLogger struct{ lines []logRecord }

func (l *recordingLogger) add(level, msg string, keyvals []any) {
	kv := map[string]any{}
	for i := 0; i+1 < len(keyvals); i += 2 {
		kv[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	l.lines = append(l.lines, logRecord{level, msg, kv})
}
func (l *recordingLogger) Debug(string, ...any)             {}
func (l *recordingLogger) Info(msg string, keyvals ...any)  { l.add("INFO", msg, keyvals) }
func (l *recordingLogger) Warn(msg string, keyvals ...any)  { l.add("WARN", msg, keyvals) }
func (l *recordingLogger) Error(msg string, keyvals ...any) { l.add("ERROR", msg, keyvals) }

type dropInput struct {
	Dedupe    bool
	Approvals bool
}

// dropWorkflow awaits one (w1 or a1) then the other (w2 or a2).
func dropWorkflow(ctx workflow.Context, in dropInput) ([]string, error) {
	if in.Dedupe {
		ctx = WithWakeDedupe(ctx)
	}
	var got []string
	for _, n := range []string{"1", "2"} {
		var id string
		var err error
		if in.Approvals {
			var d Decision
			d, err = AwaitApproval(ctx, "", "a"+n, time.Hour)
			id = d.ApprovalID
		} else {
			var w Wake
			w, err = AwaitWakeFor(ctx, "wake", "w"+n, time.Hour)
			id = w.WakeupID
		}
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrApprovalTimeout) {
			id = "timeout"
		} else if err != nil {
			return nil, err
		}
		got = append(got, id)
	}
	return got, nil
}

// Without WithWakeDedupe, the wake (or decision) of another wake-up that
// AwaitWakeFor (AwaitApproval) passes over is lost for good, and the
// await of it times out: that is logged at Warn, naming it and the cure
// (it was an Info line). With WithWakeDedupe it is kept, and nothing warns.
func TestAwaitWarnsWhenItDropsAnotherOnesSignalWithoutDedupe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       dropInput
		want     []string
		wantWarn map[string]any // nil: no warning
	}{
		{"a wake without dedupe", dropInput{}, []string{"w1", "timeout"},
			map[string]any{"wakeup_id": "w2", "awaited_wakeup_id": "w1", "signal": "wake"}},
		{"a decision without dedupe", dropInput{Approvals: true}, []string{"a1", "timeout"},
			map[string]any{"approval_id": "a2", "awaited_approval_id": "a1", "signal": ApprovalSignal}},
		{"a wake with dedupe", dropInput{Dedupe: true}, []string{"w1", "w2"}, nil},
		{"a decision with dedupe", dropInput{Dedupe: true, Approvals: true}, []string{"a1", "a2"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := &recordingLogger{}
			var suite testsuite.WorkflowTestSuite
			suite.SetLogger(logger)
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/drop-test"})
			if tc.in.Approvals {
				sendDecision(t, env, Decision{OrgID: "org-a", ApprovalID: "a2", Decision: DecisionDenied}, time.Second)
				sendDecision(t, env, Decision{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}, 2*time.Second)
			} else {
				sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w2", Outcome: OutcomeSucceeded}, time.Second)
				sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 2*time.Second)
			}

			env.ExecuteWorkflow(dropWorkflow, tc.in)

			require.NoError(t, env.GetWorkflowError())
			var got []string
			require.NoError(t, env.GetWorkflowResult(&got))
			require.Equal(t, tc.want, got)
			var warns []logRecord
			for _, l := range logger.lines {
				if l.level == "WARN" && strings.HasPrefix(l.msg, "dropping") {
					warns = append(warns, l)
				}
			}
			if tc.wantWarn == nil {
				require.Empty(t, warns)
				return
			}
			require.Len(t, warns, 1)
			require.Contains(t, warns[0].msg, "WithWakeDedupe")
			for k, v := range tc.wantWarn {
				require.Equal(t, v, warns[0].kv[k], k)
			}
		})
	}
}

// timingOutWorkflow awaits a wake (or a decision) that never comes, and
// returns the await's error, which it checks with errors.Is first.
func timingOutWorkflow(ctx workflow.Context, approval bool) error {
	var err, sentinel error
	if approval {
		_, err = AwaitApproval(ctx, "", "a1", time.Minute)
		sentinel = ErrApprovalTimeout
	} else {
		_, err = AwaitWake(ctx, "wake", time.Minute)
		sentinel = ErrTimeout
	}
	if !errors.Is(err, sentinel) || !IsTimeout(err) {
		return fmt.Errorf("inside the workflow, the timeout is not its sentinel: %w", err)
	}
	return fmt.Errorf("gave up: %w", err)
}

func TestATimeoutIsMatchedByIsTimeoutOutsideTheWorkflow(t *testing.T) {
	for _, approval := range []bool{false, true} {
		t.Run(fmt.Sprintf("approval %v", approval), func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/timeout-test"})
			env.ExecuteWorkflow(timingOutWorkflow, approval)
			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			require.Error(t, err)
			require.True(t, IsTimeout(err), "the caller sees a timeout: %v", err)
			require.False(t, errors.Is(err, ErrTimeout), "(which errors.Is cannot say across the boundary)")
		})
	}
	require.False(t, IsTimeout(errors.New("timed out waiting for the wake signal")))
	require.False(t, IsTimeout(temporal.NewApplicationError("other", "SomethingElse")))
	require.False(t, IsTimeout(nil))
}

type undecodableInput struct{ Dedupe, Approval bool }

func awaitPastAnUndecodableSignal(ctx workflow.Context, in undecodableInput) (string, error) {
	if in.Dedupe {
		ctx = WithWakeDedupe(ctx)
	}
	if in.Approval {
		d, err := AwaitApproval(ctx, "", "a1", time.Minute)
		return d.ApprovalID, err
	}
	w, err := AwaitWakeFor(ctx, "wake", "w1", time.Minute)
	return w.WakeupID, err
}

// A signal whose payload the data converter cannot decode as JSON (here a
// protobuf message on the channel) is skipped: the await still times out
// after its minute, and a cancel still ends it, with or without the shared
// wait.
func TestAnUndecodableSignalLeavesTheTimeoutAndTheCancelWorking(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		for _, approval := range []bool{false, true} {
			for _, dedupe := range []bool{false, true} {
				name := map[bool]string{false: "timeout", true: "cancel"}[cancel] +
					map[bool]string{false: "/wake", true: "/approval"}[approval] +
					map[bool]string{false: "/own-wait", true: "/shared-wait"}[dedupe]
				t.Run(name, func(t *testing.T) {
					var suite testsuite.WorkflowTestSuite
					env := suite.NewTestWorkflowEnvironment()
					env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "org-a/undecodable"})
					sig := "wake"
					if approval {
						sig = ApprovalSignal
					}
					env.RegisterDelayedCallback(func() { env.SignalWorkflow(sig, durationpb.New(time.Second)) }, time.Second)
					if cancel {
						env.RegisterDelayedCallback(env.CancelWorkflow, 2*time.Second)
					}
					// Hours after the timeout: the await must have ended by then.
					sendWake(t, env, "wake", Wake{OrgID: "org-a", WakeupID: "w1", Outcome: OutcomeSucceeded}, 2*time.Hour)
					sendDecision(t, env, Decision{OrgID: "org-a", ApprovalID: "a1", Decision: DecisionApproved}, 2*time.Hour)

					env.ExecuteWorkflow(awaitPastAnUndecodableSignal, undecodableInput{Dedupe: dedupe, Approval: approval})

					require.True(t, env.IsWorkflowCompleted())
					err := env.GetWorkflowError()
					if cancel {
						var canceled *temporal.CanceledError
						require.True(t, errors.As(err, &canceled), "want the cancel, got %v", err)
						return
					}
					require.True(t, IsTimeout(err), "want the timeout, got %v", err)
				})
			}
		}
	}
}

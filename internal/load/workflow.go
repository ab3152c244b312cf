package load

import (
	"context"
	"encoding/json"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows"
)

// WorkflowName is the name the load's workflow is registered under on the
// load's own task queue.
const WorkflowName = "reveille.load"

// wakeSignal is the signal name every load wake-up is sent under.
const wakeSignal = "wake"

// workflowInput is what a parked load workflow waits for.
type workflowInput struct {
	// ApprovalID, when set, is a tool call whose decision the workflow
	// awaits before its wake.
	ApprovalID string
	// Timeout bounds each await, so that no workflow outlives a lost run
	// by much.
	Timeout time.Duration
}

// woken is what a workflow reports to its worker's process once woken.
type woken struct {
	WorkflowID string
	WakeupID   string
	Outcome    string
	Decision   string // the tool call's, when it had one
	// Duplicates are the repeated deliveries (of its wake or its decision)
	// that were in the workflow's channels when it woke: each was ignored.
	Duplicates int
	// Others are wakes of other wake-ups (or decisions on other
	// approvals) that were in its channels when it woke: a second
	// wake-up made for one request.
	Others int
}

// parkedWorkflow parks on the tool call's decision (if any) and then on
// the wake, through the helpers an agent's own worker uses, and reports
// the wake to the load's process by a local activity: the moment the
// activity runs is the moment the workflow was woken, measured where it
// runs.
func parkedWorkflow(report func(context.Context, woken) error) func(workflow.Context, workflowInput) error {
	return func(ctx workflow.Context, in workflowInput) error {
		// (No WithWakeDedupe: its shared reader takes every signal buffered
		// with the wake off the channel and drops the repeats uncounted; the
		// workflow awaits one decision and one wake, nothing to share.)
		r := woken{WorkflowID: workflow.GetInfo(ctx).WorkflowExecution.ID}
		if in.ApprovalID != "" {
			d, err := workflows.AwaitApproval(ctx, "", in.ApprovalID, in.Timeout)
			if err != nil {
				return err
			}
			r.Decision = d.Decision
		}
		w, err := workflows.AwaitWake(ctx, wakeSignal, in.Timeout)
		if err != nil {
			return err
		}
		r.WakeupID, r.Outcome = w.WakeupID, w.Outcome
		r.Duplicates, r.Others = drainRepeats(ctx, wakeSignal, func(raw json.RawMessage) bool {
			var again workflows.Wake
			return json.Unmarshal(raw, &again) == nil && again.WakeupID == w.WakeupID
		})
		if in.ApprovalID != "" {
			d, o := drainRepeats(ctx, workflows.ApprovalSignal, func(raw json.RawMessage) bool {
				var again workflows.Decision
				return json.Unmarshal(raw, &again) == nil && again.ApprovalID == in.ApprovalID
			})
			r.Duplicates, r.Others = r.Duplicates+d, r.Others+o
		}
		lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
		return workflow.ExecuteLocalActivity(lctx, report, r).Get(lctx, nil)
	}
}

// drainRepeats takes the signals already buffered on the channel named
// signal and counts those repeat says are repeats of what woke the
// workflow.
func drainRepeats(ctx workflow.Context, signal string, repeat func(json.RawMessage) bool) (repeats, others int) {
	ch := workflow.GetSignalChannel(ctx, signal)
	for {
		var raw json.RawMessage
		if !ch.ReceiveAsync(&raw) {
			return repeats, others
		}
		if repeat(raw) {
			repeats++
		} else {
			others++
		}
	}
}

// Package reference is the engine's reference workflow and the worker that
// runs it: its activities call the services in process (no HTTP, no
// token), so it links what the engine links. An agent's own worker imports
// the parent package workflows instead.
package reference

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
)

// WorkflowName is the reference workflow's registered type name; start it
// by this name.
const WorkflowName = "ReferenceWorkflow"

// RefusedErrorType is the ApplicationError type of a wake-up whose spend was
// refused; its details are an EnqueueResult naming the approval request.
const RefusedErrorType = "WakeupRefused"

// InvalidErrorType is the ApplicationError type of a wake-up request the
// service rejected as malformed (not retried).
const InvalidErrorType = "WakeupInvalid"

// Input is the reference workflow's input: one wake-up to run.
type Input struct {
	AgentID string      `json:"agent_id"`
	Signal  string      `json:"signal"`
	Scope   string      `json:"scope"`
	Reason  string      `json:"reason"`
	Cost    int64       `json:"cost"`
	Work    wakeup.Work `json:"work"`
	Pool    string      `json:"pool,omitempty"`
	// Timeout bounds the wait for the wake (0: no bound).
	Timeout time.Duration `json:"timeout"`
}

// EnqueueResult is what the enqueue activity reports.
type EnqueueResult struct {
	WakeupID   string `json:"wakeup_id"`
	ApprovalID string `json:"approval_id,omitempty"`
}

// Result is how the reference workflow ended.
type Result struct {
	WakeupID   string `json:"wakeup_id"`
	ApprovalID string `json:"approval_id,omitempty"`
	// Refused is true when the spend was refused and the workflow waited for
	// a human's answer.
	Refused bool           `json:"refused"`
	Wake    workflows.Wake `json:"wake"`
}

// Workflow enqueues a wake-up through an activity, parks until the
// wake arrives and returns it. A refused spend is not retried: the workflow
// then waits for the approval request's resolution, which wakes it too (the
// work's outcome after an approval, "denied" after a denial or expiry).
func Workflow(ctx workflow.Context, in Input) (Result, error) {
	ctx = workflows.WithWakeDedupe(ctx)
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second, MaximumAttempts: 20,
			NonRetryableErrorTypes: []string{RefusedErrorType, InvalidErrorType},
		},
	})
	var res Result
	var enq EnqueueResult
	var acts *Activities
	err := workflow.ExecuteActivity(actx, acts.EnqueueWakeup, in).Get(ctx, &enq)
	var appErr *temporal.ApplicationError
	switch {
	case err == nil:
		res.WakeupID = enq.WakeupID
	case errors.As(err, &appErr) && appErr.Type() == RefusedErrorType:
		if derr := appErr.Details(&enq); derr != nil {
			return res, derr
		}
		res.WakeupID, res.ApprovalID, res.Refused = enq.WakeupID, enq.ApprovalID, true
		workflow.GetLogger(ctx).Info("spend refused; waiting for the approval's wake", "approval_id", enq.ApprovalID)
	default:
		return res, err
	}
	wake, err := workflows.AwaitWakeFor(ctx, in.Signal, res.WakeupID, in.Timeout)
	res.Wake = wake
	return res, err
}

// Activities call the wake-up service in process: no HTTP, no token. The
// org is the workflow's own (its id starts with "<org_id>/").
type Activities struct {
	Wakeups *wakeup.Service
}

// EnqueueWakeup creates the wake-up; its idempotency key is the workflow id
// plus the activity id (and the run id, since activity ids restart with
// every run of a reused workflow id), so a retried activity never spends
// twice. A refusal
// is a non-retryable RefusedErrorType error carrying the ids.
func (a *Activities) EnqueueWakeup(ctx context.Context, in Input) (EnqueueResult, error) {
	info := activity.GetInfo(ctx)
	wfID := info.WorkflowExecution.ID
	w, err := a.Wakeups.Create(ctx, wakeup.CreateParams{
		// The signal goes to this run: a later run of a reused workflow id
		// never receives this one's wake.
		OrgID: workflows.OrgOf(wfID), AgentID: in.AgentID, WorkflowID: wfID, RunID: info.WorkflowExecution.RunID, Signal: in.Signal, Scope: in.Scope,
		Reason: in.Reason, Cost: in.Cost, Work: in.Work, Pool: in.Pool,
		IdempotencyKey: wfID + "/" + info.WorkflowExecution.RunID + "/" + info.ActivityID, RequestedBy: "workflow:" + wfID,
	})
	var refused *wakeup.RefusedError
	var invalid *apperr.InvalidError
	switch {
	case errors.As(err, &refused):
		d := EnqueueResult{WakeupID: refused.Wakeup.ID.String(), ApprovalID: refused.ApprovalID.String()}
		return EnqueueResult{}, temporal.NewNonRetryableApplicationError(err.Error(), RefusedErrorType, nil, d)
	case errors.As(err, &invalid):
		return EnqueueResult{}, temporal.NewNonRetryableApplicationError(err.Error(), InvalidErrorType, nil)
	case err != nil:
		return EnqueueResult{}, err
	}
	return EnqueueResult{WakeupID: w.ID.String()}, nil
}

// NewWorker returns a worker on taskQueue (the engine uses
// workflows.TaskQueue) with the reference workflow and its activities
// registered; the caller starts and stops it.
func NewWorker(c client.Client, taskQueue string, wakeups *wakeup.Service) worker.Worker {
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(Workflow, workflow.RegisterOptions{Name: WorkflowName})
	w.RegisterActivity(&Activities{Wakeups: wakeups})
	return w
}

// Package reference is the engine's reference workflow and the worker that
// runs it: its activities call the services in process (no HTTP, no
// token), so it links what the engine links. An agent's own worker imports
// the parent package workflows instead.
package reference

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/approvals"
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

// InvalidErrorType is the ApplicationError type of a wake-up or tool call
// request the service rejected as malformed (not retried).
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
	// Tool, when set, is a tool call the wake-up's work needs approved
	// first: the workflow asks, and if no policy decides it, awaits the
	// human's decision.
	Tool *ToolStep `json:"tool,omitempty"`
}

// ToolStep is the tool call the reference workflow asks approval for.
type ToolStep struct {
	// SessionID defaults to the workflow id.
	SessionID string          `json:"session_id,omitempty"`
	ToolName  string          `json:"tool_name"`
	Input     json.RawMessage `json:"input,omitempty"`
	// ExpiresIn bounds the human's time to answer (0: the service's TTL).
	ExpiresIn time.Duration `json:"expires_in,omitempty"`
	// Timeout bounds the workflow's wait for the decision (0: none; the
	// request's expiry denies it anyway).
	Timeout time.Duration `json:"timeout,omitempty"`
}

// ToolResult is the answer to the reference workflow's tool call.
type ToolResult struct {
	ApprovalID string `json:"approval_id"`
	Decision   string `json:"decision"` // approved | denied
	Source     string `json:"source"`   // policy | human | expired
	Reason     string `json:"reason,omitempty"`
}

// EnqueueResult is what the enqueue activity reports.
type EnqueueResult struct {
	WakeupID   string `json:"wakeup_id"`
	ApprovalID string `json:"approval_id,omitempty"`
}

// Result is how the reference workflow ended.
type Result struct {
	// Outcome is the wake's outcome, or "denied" when the tool call was.
	Outcome string `json:"outcome"`
	// Tool is the tool call's answer (nil without a tool step).
	Tool       *ToolResult `json:"tool,omitempty"`
	WakeupID   string      `json:"wakeup_id"`
	ApprovalID string      `json:"approval_id,omitempty"`
	// Refused is true when the spend was refused and the workflow waited for
	// a human's answer.
	Refused bool           `json:"refused"`
	Wake    workflows.Wake `json:"wake"`
}

// Workflow asks for its tool call (when it has one) and, unless a policy
// decided it, parks on AwaitApproval; a denial (or expiry) ends it with
// outcome "denied". It then enqueues a wake-up through an activity, parks
// until the wake arrives and returns it. A refused spend is not retried: the workflow
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
	var acts *Activities
	if in.Tool != nil {
		tool, err := askForTool(ctx, actx, acts, in.AgentID, *in.Tool)
		res.Tool = &tool
		if err != nil {
			return res, err
		}
		if tool.Decision != workflows.DecisionApproved {
			res.Outcome = workflows.OutcomeDenied
			return res, nil
		}
	}
	var enq EnqueueResult
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
	res.Wake, res.Outcome = wake, wake.Outcome
	if err != nil && workflow.GetVersion(ctx, cancelOnGiveUpChange, workflow.DefaultVersion, 1) == 1 {
		// Timed out or canceled: nobody reads the wake. Cancel the wake-up
		// so that its work does not run, nor its pending approval charge,
		// for nothing — from a disconnected context, since a canceled one
		// runs no activity.
		dctx, _ := workflow.NewDisconnectedContext(actx)
		if cerr := workflow.ExecuteActivity(dctx, acts.CancelWakeup, res.WakeupID).Get(dctx, nil); cerr != nil {
			workflow.GetLogger(ctx).Warn("could not cancel the wake-up", "wakeup_id", res.WakeupID, "error", cerr)
		}
	}
	return res, err
}

// cancelOnGiveUpChange is the workflow.GetVersion change id of canceling
// the wake-up when the workflow stops waiting for it.
const cancelOnGiveUpChange = "reveille.reference.cancel-on-give-up"

// CancelWakeup cancels the workflow's wake-up (its work, or its pending
// approval request); a settled one is left as it is.
func (a *Activities) CancelWakeup(ctx context.Context, wakeupID string) error {
	id, err := uuid.Parse(wakeupID)
	if err != nil {
		return temporal.NewNonRetryableApplicationError(err.Error(), InvalidErrorType, nil)
	}
	_, err = a.Wakeups.Cancel(ctx, workflows.OrgOf(activity.GetInfo(ctx).WorkflowExecution.ID), "", id)
	return err
}

// askForTool requests the tool call and, when it is pending, awaits the
// decision signal.
func askForTool(ctx, actx workflow.Context, acts *Activities, agentID string, step ToolStep) (ToolResult, error) {
	var asked ToolResult
	if err := workflow.ExecuteActivity(actx, acts.RequestToolCall, agentID, step).Get(ctx, &asked); err != nil {
		return asked, err
	}
	if asked.Decision != approvals.DecisionPending {
		return asked, nil
	}
	workflow.GetLogger(ctx).Info("tool call pending; waiting for a human", "approval_id", asked.ApprovalID)
	d, err := workflows.AwaitApproval(ctx, workflows.ApprovalSignal, asked.ApprovalID, step.Timeout)
	if err != nil {
		return asked, err
	}
	source := approvals.SourceHuman
	if d.Expired() {
		source = approvals.SourceExpired
	}
	return ToolResult{ApprovalID: d.ApprovalID, Decision: d.Decision, Source: source, Reason: d.Reason}, nil
}

// Activities call the services in process: no HTTP, no token. The org is
// the workflow's own (its id starts with "<org_id>/").
type Activities struct {
	Wakeups   *wakeup.Service
	Approvals *approvals.Service
}

// RequestToolCall asks for the tool call in the workflow's session, naming
// this run as the workflow to signal; its idempotency key is the workflow
// id, run id and activity id, so a retried activity asks once. It answers
// the decision (pending when no policy decided).
func (a *Activities) RequestToolCall(ctx context.Context, agentID string, step ToolStep) (ToolResult, error) {
	info := activity.GetInfo(ctx)
	wfID := info.WorkflowExecution.ID
	p := approvals.RequestParams{
		OrgID: workflows.OrgOf(wfID), SessionID: cmp.Or(step.SessionID, wfID), AgentID: agentID, ToolName: step.ToolName, Input: step.Input,
		WorkflowID: wfID, RunID: info.WorkflowExecution.RunID, Signal: workflows.ApprovalSignal,
		IdempotencyKey: wfID + "/" + info.WorkflowExecution.RunID + "/" + info.ActivityID, RequestedBy: "workflow:" + wfID,
	}
	if step.ExpiresIn > 0 {
		p.ExpiresIn = &step.ExpiresIn
	}
	res, err := a.Approvals.Request(ctx, p)
	var invalid *apperr.InvalidError
	switch {
	case errors.As(err, &invalid), errors.Is(err, approvals.ErrSessionAgent):
		return ToolResult{}, temporal.NewNonRetryableApplicationError(err.Error(), InvalidErrorType, nil)
	case err != nil:
		return ToolResult{}, err
	}
	return ToolResult{ApprovalID: res.Approval.ID.String(), Decision: res.Decision, Source: res.Source}, nil
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
func NewWorker(c client.Client, taskQueue string, wakeups *wakeup.Service, tools *approvals.Service) worker.Worker {
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(Workflow, workflow.RegisterOptions{Name: WorkflowName})
	w.RegisterActivity(&Activities{Wakeups: wakeups, Approvals: tools})
	return w
}

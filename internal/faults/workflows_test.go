//go:build faults

package faults

import (
	"errors"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows"
)

type awaitInput struct {
	Signal  string
	Timeout time.Duration
	// Repeat is how long the workflow goes on listening after its wake:
	// a repeated delivery in that time must not wake it again.
	Repeat time.Duration
}

type awaitResult struct {
	Wakes []workflows.Wake
}

// awaitWakeWorkflow parks on one wake-up's signal, as an agent's workflow
// does, then awaits again for Repeat: AwaitWake must drop any repeated
// delivery of the same wake-up, so the second await times out.
func awaitWakeWorkflow(ctx workflow.Context, in awaitInput) (awaitResult, error) {
	ctx = workflows.WithWakeDedupe(ctx)
	var res awaitResult
	w, err := workflows.AwaitWake(ctx, in.Signal, in.Timeout)
	if err != nil {
		return res, err
	}
	res.Wakes = append(res.Wakes, w)
	w, err = workflows.AwaitWake(ctx, in.Signal, in.Repeat)
	switch {
	case errors.Is(err, workflows.ErrTimeout):
	case err != nil:
		return res, err
	default:
		res.Wakes = append(res.Wakes, w)
	}
	return res, nil
}

type approvalInput struct {
	ApprovalID string
	Timeout    time.Duration
	Repeat     time.Duration
}

type approvalResult struct {
	Decisions []workflows.Decision
}

// awaitApprovalWorkflow parks on one tool call's decision, then listens
// for Repeat more: a repeated delivery must not be returned again.
func awaitApprovalWorkflow(ctx workflow.Context, in approvalInput) (approvalResult, error) {
	ctx = workflows.WithWakeDedupe(ctx)
	var res approvalResult
	d, err := workflows.AwaitApproval(ctx, "", in.ApprovalID, in.Timeout)
	if err != nil {
		return res, err
	}
	res.Decisions = append(res.Decisions, d)
	d, err = workflows.AwaitApproval(ctx, "", in.ApprovalID, in.Repeat)
	switch {
	case errors.Is(err, workflows.ErrApprovalTimeout):
	case err != nil:
		return res, err
	default:
		res.Decisions = append(res.Decisions, d)
	}
	return res, nil
}

// quietLogger drops the Temporal SDK's logs (it is loud while Temporal is
// down, which some tests cause on purpose).
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

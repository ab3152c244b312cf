// Package workflows is the Temporal side of Reveille: AwaitWake parks a
// workflow until its wake-up resolves; the reference workflow and its
// activities show the whole round trip (enqueue a wake-up, await the wake);
// NewWorker registers them on the task queue the engine runs.
package workflows

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/wakeup"
)

// TaskQueue is the task queue of the engine's worker.
const TaskQueue = "reveille"

// Wake is the payload of a wake signal:
// {org_id, wakeup_id, outcome: succeeded|failed|canceled|denied, result?, error?}.
type Wake = wakeup.Wake

// Outcomes a Wake carries.
const (
	OutcomeSucceeded = wakeup.OutcomeSucceeded
	OutcomeFailed    = wakeup.OutcomeFailed
	OutcomeCanceled  = wakeup.OutcomeCanceled
	OutcomeDenied    = wakeup.OutcomeDenied
)

// ErrTimeout is returned by AwaitWake when no wake came in time.
var ErrTimeout = errors.New("workflows: timed out waiting for the wake signal")

type seenKey struct{}

// seenWakes remembers the wake-up ids a workflow has already been woken for.
type seenWakes map[string]bool

// WithWakeDedupe returns a context in which successive AwaitWake calls
// ignore repeated deliveries of wake-ups already returned (delivery is
// at-least-once). Call it once at the top of a workflow that awaits more
// than one wake; it is deterministic because it is rebuilt on replay.
func WithWakeDedupe(ctx workflow.Context) workflow.Context {
	if _, ok := ctx.Value(seenKey{}).(seenWakes); ok {
		return ctx
	}
	return workflow.WithValue(ctx, seenKey{}, seenWakes{})
}

// OrgOf returns the org a workflow id belongs to: the part before the first
// "/" (Reveille only signals workflows named "<org_id>/…").
func OrgOf(workflowID string) string {
	org, _, _ := strings.Cut(workflowID, "/")
	return org
}

// AwaitWake parks the workflow on the signal channel named signal until a
// wake arrives, and returns it. It ignores signals whose org_id is not the
// workflow's own org (from its id) and repeated deliveries of a wake-up
// already seen (see WithWakeDedupe). A timeout > 0 bounds the wait:
// ErrTimeout then. A malformed signal is skipped and logged.
func AwaitWake(ctx workflow.Context, signal string, timeout time.Duration) (Wake, error) {
	return awaitWake(ctx, signal, "", timeout)
}

// AwaitWakeFor is AwaitWake for one wake-up: wakes of other wake-ups on the
// same signal (an earlier run's, another caller's) are skipped. Use it when
// the workflow knows the id it waits for, as after creating the wake-up.
func AwaitWakeFor(ctx workflow.Context, signal, wakeupID string, timeout time.Duration) (Wake, error) {
	return awaitWake(ctx, signal, wakeupID, timeout)
}

// awaitWake waits for a wake of the workflow's org, not seen before, and of
// wakeupID when that is set.
func awaitWake(ctx workflow.Context, signal, wakeupID string, timeout time.Duration) (Wake, error) {
	logger := workflow.GetLogger(ctx)
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(seenWakes)
	ch := workflow.GetSignalChannel(ctx, signal)

	var timedOut bool
	var timerCancel workflow.CancelFunc
	var timer workflow.Future
	if timeout > 0 {
		var tctx workflow.Context
		tctx, timerCancel = workflow.WithCancel(ctx)
		timer = workflow.NewTimer(tctx, timeout)
		defer timerCancel()
	}
	for {
		var wake Wake
		var got bool
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(ch, func(c workflow.ReceiveChannel, _ bool) {
			var raw json.RawMessage
			c.Receive(ctx, &raw)
			wake, got = decodeWake(raw)
		})
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timedOut = true })
		}
		// A canceled workflow stops waiting (also without a timeout).
		sel.AddReceive(ctx.Done(), func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.Select(ctx)
		if got && wake.OrgID == org && (wakeupID == "" || wake.WakeupID == wakeupID) && (seen == nil || !seen[wake.WakeupID]) {
			// A wake received in the same step as a cancellation is still
			// returned: it was taken off the channel.
			if seen != nil {
				seen[wake.WakeupID] = true
			}
			return wake, nil
		}
		if err := ctx.Err(); err != nil {
			return Wake{}, err
		}
		if timedOut {
			return Wake{}, ErrTimeout
		}
		switch {
		case !got:
			logger.Warn("ignoring a malformed wake signal", "signal", signal)
		case wake.OrgID != org:
			logger.Warn("ignoring a wake signal of another org", "signal", signal, "signal_org", wake.OrgID)
		case wakeupID != "" && wake.WakeupID != wakeupID:
			logger.Info("ignoring the wake of another wake-up", "signal", signal, "wakeup_id", wake.WakeupID, "awaiting", wakeupID)
		default:
			logger.Info("ignoring a repeated wake delivery", "wakeup_id", wake.WakeupID)
		}
	}
}

package workflows

import (
	"encoding/json"
	"errors"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows/signals"
)

// Decision is the payload of a tool approval's signal:
// {org_id, approval_id, tool_name, decision: approved|denied, reason?}.
type Decision = signals.Decision

// Decisions a Decision carries; an expired request is denied with
// Reason ReasonExpired.
const (
	DecisionApproved = signals.DecisionApproved
	DecisionDenied   = signals.DecisionDenied
	ReasonExpired    = signals.ReasonExpired
)

// ApprovalSignal is the signal name of a tool approval's decision unless
// its request named another.
const ApprovalSignal = signals.ApprovalSignal

// ErrApprovalTimeout is returned by AwaitApproval when no decision came in
// time — not a denial: the request may still be answered (or expire) later.
var ErrApprovalTimeout = errors.New("workflows: timed out waiting for the tool approval's decision")

// AwaitApproval parks the workflow on the signal channel named signal ("":
// ApprovalSignal) until the decision on tool approval approvalID arrives,
// and returns it. It ignores signals of another org (from the workflow's
// id), decisions on other approvals, and — in a context from WithWakeDedupe
// — repeated deliveries of a decision it already returned (delivery is
// at-least-once). In such a context a decision on another approval is kept,
// not lost: a later AwaitApproval for that approval returns it at once (a
// workflow that asked for two tool calls may be answered in either order).
// A timeout > 0 bounds the wait: ErrApprovalTimeout then.
// An expired request arrives as a denial with Reason ReasonExpired.
func AwaitApproval(ctx workflow.Context, signal, approvalID string, timeout time.Duration) (Decision, error) {
	if signal == "" {
		signal = ApprovalSignal
	}
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(seenWakes)
	held, _ := ctx.Value(heldKey{}).(heldDecisions)
	if d, ok := held[approvalID]; ok {
		delete(held, approvalID)
		seen["approval:"+approvalID] = true
		return d, nil
	}
	return awaitSignal(ctx, signal, timeout, ErrApprovalTimeout, decodeDecision, func(d Decision) string {
		switch {
		case d.OrgID != org:
			return "ignoring a decision of another org"
		case seen != nil && seen["approval:"+d.ApprovalID]:
			return "ignoring a repeated decision delivery"
		case d.ApprovalID != approvalID:
			if _, ok := held[d.ApprovalID]; held != nil && !ok {
				held[d.ApprovalID] = d // the first delivery; a repeat is ignored
				return "keeping the decision on another approval for its AwaitApproval"
			}
			return "ignoring the decision on another approval"
		}
		if seen != nil {
			seen["approval:"+d.ApprovalID] = true
		}
		return ""
	})
}

// decodeDecision reads a decision from a signal's JSON; ok is false unless
// it names an approval and says approved or denied.
func decodeDecision(raw json.RawMessage) (Decision, bool) {
	var d Decision
	if err := json.Unmarshal(raw, &d); err != nil || d.ApprovalID == "" ||
		(d.Decision != DecisionApproved && d.Decision != DecisionDenied) {
		return Decision{}, false
	}
	return d, true
}

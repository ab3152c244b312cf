package workflows

import (
	"cmp"
	"encoding/json"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows/signals"
)

// Decision is the payload of a tool approval's signal (signals.Decision):
// {org_id, approval_id, tool_name, decision: approved|denied,
// source: human|expired, reason?}. Its fields:
//
//   - OrgID: the request's org (AwaitApproval returns only decisions of
//     the workflow's own org, its id's prefix).
//   - ApprovalID: the tool approval request decided.
//   - ToolName: the tool the agent asked to call.
//   - Decision: DecisionApproved or DecisionDenied (Approved reports the
//     first). Anything else — a value a newer server may send — is
//     returned as it is: treat it as not approved (Approved is false).
//   - Source: who decided — signals.SourceHuman (an approver answered) or
//     signals.SourceExpired (nobody answered before the request expired:
//     the decision is then DecisionDenied). Expired reports the second.
//     A standing policy decides at once, with no signal.
//   - Reason: the approver's note, if any, or ReasonExpired for an expired
//     request.
//
// Tell an expiry by Source (d.Expired()), never by Reason: a human who
// denies with the note "expired" sends Source human and Reason "expired".
type Decision = signals.Decision

// Decisions a Decision carries. An expired request is denied with Source
// signals.SourceExpired (Decision.Expired) and Reason ReasonExpired; tell
// it by Source, since a human's note may read "expired" too.
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
// Inside the workflow, errors.Is(err, ErrApprovalTimeout); outside it,
// IsTimeout.
var ErrApprovalTimeout error = temporal.NewApplicationError("workflows: timed out waiting for the tool approval's decision", ApprovalTimeoutType)

// AwaitApproval parks the workflow on the signal channel named signal ("":
// ApprovalSignal) until the decision on tool approval approvalID arrives,
// and returns it. It ignores signals of another org (from the workflow's
// id), decisions on other approvals, and — in a context from WithWakeDedupe
// — repeated deliveries of a decision it already returned (delivery is
// at-least-once). In such a context a decision on another approval is kept,
// not lost: a later AwaitApproval for that approval returns it at once (a
// workflow that asked for two tool calls may be answered in either order,
// and may await both at once from parallel coroutines). Without that
// context it is dropped, logged at Warn with its approval_id.
// A timeout > 0 bounds the wait: ErrApprovalTimeout then; 0 waits without
// limit, and a negative one is an error, as is an empty approvalID (no
// decision is without its approval's id).
// An expired request arrives as a denial whose Expired method reports true
// (Source signals.SourceExpired); tell it by that, not by Reason, which a
// human's note may spell ReasonExpired too.
func AwaitApproval(ctx workflow.Context, signal, approvalID string, timeout time.Duration) (Decision, error) {
	if err := checkAwait(ctx, "AwaitApproval", cmp.Or(signal, ApprovalSignal), timeout); err != nil {
		return Decision{}, err
	}
	if err := checkAwaitID(ctx, "AwaitApproval", "approval", approvalID); err != nil {
		return Decision{}, err
	}
	if signal == "" {
		signal = ApprovalSignal
	}
	if readers, ok := sharedWait(ctx); ok {
		return awaitHeldDecision(ctx, readers, signal, approvalID, timeout)
	}
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(*seenWakes)
	held, _ := ctx.Value(heldKey{}).(heldDecisions)
	if d, ok := held[approvalID]; ok {
		delete(held, approvalID)
		seen.mark("approval:" + approvalID)
		return d, nil
	}
	return awaitSignal(ctx, signal, timeout, ErrApprovalTimeout, decodeDecision, func(d Decision) skipped {
		switch {
		case d.OrgID != org:
			return skipped{why: "ignoring a decision of another org"}
		case seen.has("approval:" + d.ApprovalID):
			return skipped{why: "ignoring a repeated decision delivery"}
		case d.ApprovalID != approvalID && held == nil:
			// As for AwaitWakeFor: delivered once, kept by nothing.
			return skipped{why: "dropping the decision on another approval: without WithWakeDedupe nothing keeps it, and a later AwaitApproval of it waits until its timeout; call WithWakeDedupe at the top of the workflow",
				warn: true, kv: []any{"approval_id", d.ApprovalID, "awaited_approval_id", approvalID}}
		case d.ApprovalID != approvalID:
			if _, ok := held[d.ApprovalID]; !ok {
				held[d.ApprovalID] = d // the first delivery; a repeat is ignored
				return skipped{why: "keeping the decision on another approval for its AwaitApproval"}
			}
			return skipped{why: "ignoring the decision on another approval"}
		}
		seen.mark("approval:" + d.ApprovalID)
		return skipped{}
	})
}

// awaitHeldDecision is AwaitApproval on the shared wait state: the
// channel's reader holds every new decision of the workflow's org, and the
// await takes the one on approvalID.
func awaitHeldDecision(ctx workflow.Context, readers signalReaders, signal, approvalID string, timeout time.Duration) (Decision, error) {
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen := ctx.Value(seenKey{}).(*seenWakes)
	held := ctx.Value(heldKey{}).(heldDecisions)
	heldWakes := ctx.Value(heldWakesKey{}).(*heldWakes)
	logger := workflow.GetLogger(ctx)
	var d Decision
	take := func() bool {
		var ok bool
		if d, ok = held[approvalID]; ok {
			delete(held, approvalID)
		}
		return ok
	}
	if !take() {
		hold := func(raw json.RawMessage) {
			v, ok := decodeDecision(raw)
			_, holds := held[v.ApprovalID]
			switch {
			case !ok && holdOtherKind(ctx, raw, org, signal, seen, heldWakes, held):
				// a wake on the same channel: kept for its AwaitWake
			case !ok:
				logger.Warn("ignoring a malformed signal", "signal", signal)
			case v.OrgID != org:
				logger.Info("ignoring a decision of another org", "signal", signal)
			case seen.has("approval:"+v.ApprovalID) || holds:
				logger.Info("ignoring a repeated decision delivery", "signal", signal, "approval_id", v.ApprovalID)
			default:
				held[v.ApprovalID] = v
			}
		}
		done := readers.wait(ctx, "approval", signal, hold)
		err := awaitHeld(ctx, timeout, ErrApprovalTimeout, take, readLate(ctx, signal, hold))
		done()
		if err != nil {
			return Decision{}, err
		}
	}
	seen.mark("approval:" + approvalID)
	return d, nil
}

// decodeDecision reads a decision from a signal's JSON; ok is false unless
// it names an approval and a decision. Any decision is taken, not only
// approved and denied: a value a newer server sends (say "canceled") is
// still the answer to the awaited call, and dropping it as malformed
// would park the workflow until its timeout, or for good. Approved is
// false for it, so a caller that goes ahead only on Approved stays safe.
func decodeDecision(raw json.RawMessage) (Decision, bool) {
	var d Decision
	if err := json.Unmarshal(raw, &d); err != nil || d.ApprovalID == "" || d.Decision == "" {
		return Decision{}, false
	}
	return d, true
}

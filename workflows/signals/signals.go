// Package signals is the contract between Reveille and the Temporal
// workflows it wakes: the task queue, the signal names, and the payloads
// with their outcome and decision vocabularies. It is a leaf (the standard
// library only), so that the service and a workflow author's worker share
// it without either linking the other's dependencies.
package signals

import (
	"encoding/json"
	"strings"
)

// TaskQueue is the task queue of the engine's own Temporal worker, which
// runs the engine's reference workflow only: a workflow author's workflow
// started on it never runs (its workflow tasks fail with "unable to find
// workflow type"). Authors run their workflows on a task queue of their
// own, with a worker of their own.
const TaskQueue = "reveille"

// ApprovalSignal is the signal name a tool approval's decision is sent
// under when its request names none.
const ApprovalSignal = "approval"

// Outcomes a Wake carries (SPEC §5).
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomeCanceled  = "canceled"
	OutcomeDenied    = "denied"
)

// Wake is the payload of a wake-up's signal:
// {org_id, wakeup_id, outcome: succeeded|failed|canceled|denied, result?, error?}.
type Wake struct {
	OrgID    string          `json:"org_id"`
	WakeupID string          `json:"wakeup_id"`
	Outcome  string          `json:"outcome"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
}

// Decisions a tool approval's Decision carries (SPEC §7). An expired
// request is denied with Source SourceExpired (Decision.Expired) and
// Reason ReasonExpired; tell it by Source, since a human's note may read
// "expired" too.
const (
	DecisionApproved = "approved"
	DecisionDenied   = "denied"
)

// ReasonExpired is the Decision.Reason of a request nobody answered in
// time. A human's note may read the same: tell an expiry by
// Decision.Source (Decision.Expired).
const ReasonExpired = "expired"

// Sources a Decision carries: who decided. A signalled decision is a
// human's or the expiry sweeper's (a policy decides at once, unsignalled).
const (
	SourceHuman   = "human"
	SourceExpired = "expired"
)

// Decision is the payload of a tool approval's signal:
// {org_id, approval_id, tool_name, decision: approved|denied, source, reason?}.
type Decision struct {
	OrgID      string `json:"org_id"`
	ApprovalID string `json:"approval_id"`
	ToolName   string `json:"tool_name"`
	Decision   string `json:"decision"`
	// Source says who decided: SourceHuman or SourceExpired. Tell an expiry
	// by it, not by Reason, which a human's note may spell the same.
	Source string `json:"source,omitempty"`
	// Reason is "expired" for an expired request, else the approver's note
	// (if any), which may read "expired" too.
	Reason string `json:"reason,omitempty"`
}

// Expired reports whether nobody answered the request in time.
func (d Decision) Expired() bool { return d.Source == SourceExpired }

// Approved reports whether the tool call may go ahead: only for
// DecisionApproved. A decision this package does not know (a newer
// server's) is not an approval.
func (d Decision) Approved() bool { return d.Decision == DecisionApproved }

// OrgOf returns the org a workflow id belongs to: the part before the first
// "/" (Reveille only signals workflows named "<org_id>/…").
func OrgOf(workflowID string) string {
	org, _, _ := strings.Cut(workflowID, "/")
	return org
}

// Owns reports whether workflowID names a workflow of orgID: "<org_id>/"
// and something after it, as OrgOf reads it. An org id holding a "/" owns
// no workflow. The service signals only workflows their org owns.
func Owns(orgID, workflowID string) bool {
	org, rest, _ := strings.Cut(workflowID, "/")
	return org == orgID && rest != ""
}

// OwnsNone reports whether orgID owns no workflow at all, whatever the id
// (Owns): it holds a "/". OwnsNoneRule says why, for an error's detail.
func OwnsNone(orgID string) bool { return strings.Contains(orgID, "/") }

// OwnsNoneRule is the rule OwnsNone applies, in words.
const OwnsNoneRule = `an org id holding "/" owns no workflow, as a workflow id's org is what precedes its first "/"`

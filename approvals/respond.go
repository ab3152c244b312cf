package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workflows/signals"
)

// RespondParams answer a session's pending call(s) and may set the
// standing policy.
type RespondParams struct {
	OrgID     string
	SessionID string
	// Exactly one of ToolName (every unexpired pending call of the tool in
	// the session) and ApprovalID (that one call).
	ToolName   string
	ApprovalID uuid.UUID
	// Decision (approved or denied) answers the call(s), this turn only.
	Decision string
	// UpdatePolicy, when set (always, once, never), upserts the agent's
	// unconditional policy for the tool: the other axis, future calls.
	UpdatePolicy string
	Note         string
	// ResolvedBy is the resolver's token sub; it may not have made any of
	// the calls it answers.
	ResolvedBy string
}

// RespondResult lists the approvals resolved and the unconditional policy
// for the tool after the answer (nil: none).
type RespondResult struct {
	Resolved []uuid.UUID
	Policy   *string
}

// Respond answers pending calls and/or sets the standing policy, in one
// transaction. Answering by tool name is all or nothing: if the resolver
// made any of the calls, nothing is resolved (ErrSelfApproval). Errors:
// *apperr.InvalidError, ErrSessionNotFound, ErrNotFound, ErrSelfApproval,
// ErrNoResolver, ErrAlreadyResolved, ErrNothingPending.
func (s *Service) Respond(ctx context.Context, p RespondParams) (RespondResult, error) {
	if err := validateRespond(p); err != nil {
		return RespondResult{}, err
	}
	if p.ResolvedBy == "" {
		return RespondResult{}, ErrNoResolver
	}
	var res RespondResult
	var timings []resolved
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var agentID string
		err := tx.QueryRow(ctx, qLockSession, p.OrgID, p.SessionID).Scan(&agentID)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrSessionNotFound
		}
		if err != nil {
			return fmt.Errorf("locking session: %w", err)
		}
		targets, tool, err := lockTargets(ctx, tx, p)
		if err != nil {
			return err
		}
		if len(targets) == 0 && p.UpdatePolicy == "" {
			return ErrNothingPending
		}
		status := StatusApproved
		if p.Decision == DecisionDenied {
			status = StatusDenied
		}
		var events []newEvent
		res.Resolved = []uuid.UUID{}
		for _, id := range targets {
			r, err := resolveTx(ctx, tx, p.OrgID, id, qResolve, p.OrgID, id, status, SourceHuman, p.ResolvedBy, p.Note)
			if err != nil {
				return err
			}
			if err := queueDecision(ctx, tx, p.OrgID, id, r, p.Decision, SourceHuman, p.Note); err != nil {
				return err
			}
			res.Resolved, timings = append(res.Resolved, id), append(timings, r)
			events = append(events, newEvent{EventResolved, map[string]any{"approval_id": id, "tool_name": r.tool, "decision": p.Decision,
				"source": SourceHuman, "updated_policy": nullIfEmpty(p.UpdatePolicy)}})
			if p.Decision == DecisionDenied {
				events = append(events, newEvent{EventDenied, map[string]any{"approval_id": id, "tool_name": r.tool}})
			}
		}
		if len(targets) == 0 {
			// Only a policy set: the session still records it (SPEC §7
			// appends the resolved event on every answer), with no call
			// to name and no turn.tool_call.denied, as no call was denied.
			events = append(events, newEvent{EventResolved, map[string]any{"approval_id": nil, "tool_name": tool, "decision": p.Decision,
				"source": SourceHuman, "updated_policy": p.UpdatePolicy}})
		}
		if p.UpdatePolicy != "" {
			if _, err := tx.Exec(ctx, qUpsertUnconditionalPolicy, newID(), p.OrgID, agentID, tool, p.UpdatePolicy, p.ResolvedBy); err != nil {
				return fmt.Errorf("setting tool policy: %w", err)
			}
			res.Policy = &p.UpdatePolicy // what was just written
		} else if res.Policy, err = unconditionalPolicy(ctx, tx, p.OrgID, agentID, tool); err != nil {
			return err
		}
		if err := appendEvents(ctx, tx, p.OrgID, p.SessionID, events...); err != nil {
			return err
		}
		return s.appendInbox(ctx, tx, inbox.TypeResolved, p.OrgID, res.Resolved...)
	})
	if err != nil {
		return RespondResult{}, err
	}
	for _, r := range timings {
		s.metrics.resolved(SourceHuman, p.Decision, r.resolvedAt.Sub(r.createdAt))
	}
	return res, nil
}

func validateRespond(p RespondParams) error {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "session_id", p.SessionID, MaxID)
	switch {
	case p.ToolName == "" && p.ApprovalID == uuid.Nil:
		inv.Add("tool_name", "give tool_name or approval_id")
		inv.Add("approval_id", "give tool_name or approval_id")
	case p.ToolName != "" && p.ApprovalID != uuid.Nil:
		inv.Add("tool_name", "give tool_name or approval_id, not both")
		inv.Add("approval_id", "give tool_name or approval_id, not both")
	case p.ToolName != "":
		checkToolName(inv, "tool_name", p.ToolName)
	}
	switch p.Decision {
	case DecisionApproved, DecisionDenied:
	case "":
		inv.Add("decision", "is required: approved or denied")
	default:
		inv.Add("decision", "must be approved or denied")
	}
	checkPolicy(inv, "update_policy", p.UpdatePolicy, false)
	checkText(inv, "note", p.Note, MaxText, false)
	return inv.OrNil()
}

// lockTargets locks the calls an answer resolves and returns them with the
// tool they are for, refusing the whole answer if the resolver made any.
func lockTargets(ctx context.Context, tx pgx.Tx, p RespondParams) ([]uuid.UUID, string, error) {
	var rows pgx.Rows
	var err error
	if p.ApprovalID != uuid.Nil {
		rows, err = tx.Query(ctx, qLockApproval, p.OrgID, p.SessionID, p.ApprovalID)
	} else {
		rows, err = tx.Query(ctx, qPendingForTool, p.OrgID, p.SessionID, p.ToolName)
	}
	if err != nil {
		return nil, "", fmt.Errorf("locking pending tool calls: %w", err)
	}
	type target struct {
		id               uuid.UUID
		tool, requester  string
		pending, expired bool
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (target, error) {
		var t target
		return t, r.Scan(&t.id, &t.tool, &t.requester, &t.pending, &t.expired)
	})
	if err != nil {
		return nil, "", fmt.Errorf("locking pending tool calls: %w", err)
	}
	tool := p.ToolName
	if p.ApprovalID != uuid.Nil {
		if len(found) == 0 {
			return nil, "", ErrNotFound
		}
		tool = found[0].tool
	}
	ids := make([]uuid.UUID, 0, len(found))
	for _, t := range found {
		switch {
		case t.requester != "" && t.requester == p.ResolvedBy:
			return nil, "", ErrSelfApproval
		case !t.pending:
			return nil, "", ErrAlreadyResolved
		case t.expired:
			return nil, "", fmt.Errorf("%w (it expired)", ErrAlreadyResolved)
		}
		ids = append(ids, t.id)
	}
	return ids, tool, nil
}

// resolved is what resolving a request returns for its signal and metrics.
type resolved struct {
	tool, workflowID, runID, signal string
	createdAt, resolvedAt           time.Time
}

// resolveTx runs a resolving statement (qResolve or qExpire) on one request.
func resolveTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, sql string, args ...any) (resolved, error) {
	var r resolved
	err := tx.QueryRow(ctx, sql, args...).Scan(&r.tool, &r.workflowID, &r.runID, &r.signal, &r.createdAt, &r.resolvedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: tool approval %s of org %s changed while locked", ErrAlreadyResolved, id, orgID)
	}
	if err != nil {
		return r, fmt.Errorf("resolving tool approval: %w", err)
	}
	return r, nil
}

// queueDecision queues the decision's signal for a request that named a
// workflow, in the resolving transaction; the approval id is the message's
// idempotency key, so a request has at most one signal.
func queueDecision(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, r resolved, decision, source, reason string) error {
	if r.workflowID == "" {
		return nil
	}
	payload, err := json.Marshal(signals.Decision{OrgID: orgID, ApprovalID: id.String(), ToolName: r.tool, Decision: decision, Source: source, Reason: reason})
	if err != nil {
		return err
	}
	_, _, err = queue.Enqueue(ctx, tx, queue.EnqueueParams{
		OrgID: orgID, Queue: Queue, Payload: payload, IdempotencyKey: id.String(),
		Signal: &queue.Signal{WorkflowID: r.workflowID, RunID: r.runID, Name: r.signal},
	})
	if err != nil {
		return fmt.Errorf("queue decision signal: %w", err)
	}
	return nil
}

// newEvent is a session event to append; its payload is marshalled as is
// (snake_case keys).
type newEvent struct {
	name    string
	payload map[string]any
}

// appendEvents appends events to a session whose row lock the transaction
// holds, numbering them after the session's last.
func appendEvents(ctx context.Context, tx pgx.Tx, orgID, sessionID string, events ...newEvent) error {
	if len(events) == 0 {
		return nil
	}
	names, payloads := make([]string, len(events)), make([]string, len(events))
	for i, e := range events {
		b, err := json.Marshal(e.payload)
		if err != nil {
			return fmt.Errorf("encoding session event %s: %w", e.name, err)
		}
		names[i], payloads[i] = e.name, string(b)
	}
	if _, err := tx.Exec(ctx, qAppendEvents, orgID, sessionID, names, payloads); err != nil {
		return fmt.Errorf("appending session events: %w", err)
	}
	return nil
}

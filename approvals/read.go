package approvals

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/page"
	"github.com/reveille/reveille/queue"
)

// Get returns one tool approval of the org; with agentID set, only if it
// is that agent's (another's is ErrNotFound, as another org's is).
func (s *Service) Get(ctx context.Context, orgID string, id uuid.UUID, agentID string) (ToolApproval, error) {
	a, err := scanApproval(s.db.QueryRow(ctx, approvalSelect+` WHERE a.org_id = $1 AND a.id = $2 AND ($3::text = '' OR a.agent_id = $3)`,
		orgID, id, agentID))
	if errors.Is(err, pgx.ErrNoRows) {
		return ToolApproval{}, ErrNotFound
	}
	if err != nil {
		return ToolApproval{}, fmt.Errorf("reading tool approval: %w", err)
	}
	return a, nil
}

// ListFilter narrows List; empty fields match everything.
type ListFilter struct {
	// Status is pending, resolved (approved, denied or expired), or one of
	// approved, denied, expired.
	Status    string
	AgentID   string
	SessionID string
}

// List returns a page of the org's tool approvals, newest first (the
// human inbox), and the cursor of the next page (nil at the end).
func (s *Service) List(ctx context.Context, orgID string, f ListFilter, p Page) ([]ToolApproval, *uuid.UUID, error) {
	inv := &apperr.InvalidError{}
	var statusCond string
	switch f.Status {
	case "":
	case "resolved":
		statusCond = ` AND a.status <> 'pending'`
	case StatusPending, StatusApproved, StatusDenied, StatusExpired:
		statusCond = ` AND a.status = '` + f.Status + `'`
	default:
		inv.Add("status", "must be pending or resolved (or approved, denied, expired)")
	}
	checkText(inv, "agent_id", f.AgentID, MaxText, false)
	checkText(inv, "session_id", f.SessionID, MaxID, false)
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, approvalSelect+`
		WHERE a.org_id = $1 AND ($2::text = '' OR a.agent_id = $2) AND ($3::text = '' OR a.session_id = $3)
		  AND ($4::uuid IS NULL OR a.id < $4)`+statusCond+`
		ORDER BY a.id DESC LIMIT $5`, orgID, f.AgentID, f.SessionID, p.After(), p.Size()+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing tool approvals: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ToolApproval, error) { return scanApproval(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing tool approvals: %w", err)
	}
	items, next := page.Trim(items, p.Size(), func(a ToolApproval) uuid.UUID { return a.ID })
	return items, next, nil
}

// Events returns up to limit (default 50, at most MaxLimit) of a session's
// events after seq after (exclusive), and the seq to read after next (nil
// when none is stored beyond this page). With agentID set, another agent's
// session is ErrSessionNotFound, as another org's is.
func (s *Service) Events(ctx context.Context, orgID, sessionID, agentID string, after int64, limit int) ([]Event, *int64, error) {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "session_id", sessionID, MaxID)
	if after < 0 {
		inv.Add("after", "must be an integer ≥ 0")
	}
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	limit = Page{Limit: limit}.Size()
	var visible bool
	if err := s.db.QueryRow(ctx, qSessionVisible, orgID, sessionID, agentID).Scan(&visible); err != nil {
		return nil, nil, fmt.Errorf("reading session: %w", err)
	}
	if !visible {
		return nil, nil, ErrSessionNotFound
	}
	rows, err := s.db.Query(ctx, qEvents, orgID, sessionID, after, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("reading session events: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		return e, r.Scan(&e.Seq, &e.Name, &e.Payload, &e.CreatedAt)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading session events: %w", err)
	}
	if len(events) <= limit {
		return events, nil, nil
	}
	events = events[:limit]
	next := events[limit-1].Seq
	return events, &next, nil
}

func scanApproval(row pgx.Row) (ToolApproval, error) {
	var a ToolApproval
	var input []byte
	var msgStatus *string
	var d Delivery
	err := row.Scan(&a.ID, &a.OrgID, &a.SessionID, &a.AgentID, &a.ToolName, &input, &a.Status, &a.Source, &a.PolicyID,
		&a.RequestedBy, &a.ResolvedBy, &a.Note, &a.WorkflowID, &a.RunID, &a.Signal, &msgStatus, &d.Attempts, &d.LastError,
		&a.CreatedAt, &a.ExpiresAt, &a.ResolvedAt)
	if err != nil {
		return a, err
	}
	if len(input) > 0 {
		a.Input = input
	}
	// A policy's decision is answered to the caller at once: no signal.
	if a.WorkflowID != "" && a.Source != SourcePolicy {
		switch deref(msgStatus) {
		case "":
			d.State = DeliveryWaiting
		case queue.StatusPending:
			d.State = DeliveryQueued
		case queue.StatusDelivered:
			d.State = DeliverySent
		case queue.StatusFailed:
			d.State = DeliveryUndeliverable
		}
		a.Delivery = &d
	}
	return a, nil
}

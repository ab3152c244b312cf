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
	// Delivery is the decision signal's state: waiting, queued, sent or
	// undeliverable (an admin's list of the decisions to redeliver). Only
	// a human's answer or an expiry of a call that named a workflow has
	// one.
	Delivery string
}

// deliveryConds are List's conditions of each delivery state on the
// approval a and its signal message m (scanApproval's states).
var deliveryConds = map[string]string{
	DeliveryWaiting:       ` AND m.status IS NULL`,
	DeliveryQueued:        ` AND m.status = 'pending'`,
	DeliverySent:          ` AND m.status = 'delivered'`,
	DeliveryUndeliverable: ` AND m.status = 'failed'`,
}

// hasDelivery is the condition that an approval has a delivery state: its
// call named a workflow and no standing policy answered it.
const hasDelivery = ` AND coalesce(a.workflow_id, '') <> '' AND coalesce(a.source, '') <> '` + SourcePolicy + `'`

// undeliverableRows narrows a list of undeliverable decisions to the
// failed messages of the queue (few, beside the org's settled calls).
const undeliverableRows = ` AND a.id IN (SELECT idempotency_key::uuid FROM queue_messages
  WHERE org_id = $1 AND queue = '` + Queue + `' AND status = 'failed')`

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
	if cond, ok := deliveryConds[f.Delivery]; ok {
		statusCond += hasDelivery + cond
		if f.Delivery == DeliveryUndeliverable {
			statusCond += undeliverableRows
		}
	} else if f.Delivery != "" {
		inv.Add("delivery", "must be waiting, queued, sent or undeliverable")
	}
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, approvalSelect+`
		WHERE a.org_id = $1 AND ($2::text = '' OR a.agent_id = $2) AND ($3::text = '' OR a.session_id = $3)
		  AND a.id < coalesce($4::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')`+statusCond+`
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

// Redeliver queues again the decision signal of tool approval id that
// was given up on (delivery undeliverable: its workflow was not found past
// the grace period, or its run closed), as POST /v1/wakeups/{id}/redeliver
// does a wake-up's. Any other delivery state is ErrNotUndeliverable. With
// agentID set, another agent's approval is ErrNotFound, as in Get. It
// returns the approval, its signal queued.
func (s *Service) Redeliver(ctx context.Context, orgID, agentID string, id uuid.UUID) (ToolApproval, error) {
	a, err := s.Get(ctx, orgID, id, agentID)
	if err != nil {
		return ToolApproval{}, err
	}
	if a.Delivery == nil || a.Delivery.State != DeliveryUndeliverable {
		return a, ErrNotUndeliverable
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// The row lock holds off retention, which skips locked rows and
		// keeps the message while the approval stands.
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM tool_approvals WHERE org_id = $1 AND id = $2 FOR UPDATE`, orgID, id).Scan(&one); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return fmt.Errorf("locking tool approval: %w", err)
		}
		msg, err := queue.GetByKey(ctx, tx, orgID, Queue, id.String())
		if err != nil {
			if errors.Is(err, queue.ErrNotFound) {
				return ErrNotUndeliverable
			}
			return err
		}
		if ok, err := queue.Redeliver(ctx, tx, orgID, msg.ID); err != nil {
			return err
		} else if !ok {
			return ErrNotUndeliverable
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotUndeliverable) {
			return a, err
		}
		return ToolApproval{}, err
	}
	s.logger.Info("tool approval's signal queued again", "org_id", orgID, "approval_id", id, "workflow_id", a.WorkflowID)
	return s.Get(ctx, orgID, id, "")
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

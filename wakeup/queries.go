package wakeup

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workpool"
)

// selectWakeup reads a wake-up with its approval state and its signal's
// delivery state (the queue message keyed by the wake-up id).
const selectWakeup = `
SELECT w.id, w.org_id, w.agent_id, w.workflow_id, coalesce(w.run_id, ''), w.signal, w.scope, w.reason, w.cost, w.pool, w.work,
       w.state, coalesce(w.outcome, ''), w.result, coalesce(w.error, ''), w.approval_id, a.state, w.work_id,
       m.status, coalesce(m.attempts, 0), coalesce(m.last_error, ''), w.created_at, greatest(w.updated_at, m.updated_at)
  FROM wakeups w
  LEFT JOIN mandate_approvals a ON a.org_id = w.org_id AND a.id = w.approval_id
  LEFT JOIN queue_messages m ON m.org_id = w.org_id AND m.queue = '` + Queue + `' AND m.idempotency_key = w.id::text
`

func scanWakeup(row pgx.Row) (Wakeup, error) {
	var w Wakeup
	var state string
	var approvalID *uuid.UUID
	var approvalState, msgStatus *string
	err := row.Scan(&w.ID, &w.OrgID, &w.AgentID, &w.WorkflowID, &w.RunID, &w.Signal, &w.Scope, &w.Reason, &w.Cost, &w.Pool, &w.Work,
		&state, &w.Outcome, &w.Result, &w.Error, &approvalID, &approvalState, &w.WorkID,
		&msgStatus, &w.Delivery.Attempts, &w.Delivery.LastError, &w.CreatedAt, &w.UpdatedAt)
	if err != nil {
		return w, err
	}
	if approvalID != nil {
		w.Approval = &Approval{ID: *approvalID, State: deref(approvalState)}
	}
	// SPEC §5's state table.
	switch deref(msgStatus) {
	case "":
		w.Status, w.Delivery.State = StatusPending, DeliveryWaiting
	case queue.StatusPending:
		w.Status, w.Delivery.State = StatusPending, DeliveryQueued
	case queue.StatusDelivered:
		w.Status, w.Delivery.State = StatusDelivered, DeliverySent
	case queue.StatusFailed:
		w.Status, w.Delivery.State = StatusFailed, DeliveryUndeliverable
	}
	return w, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// AnyAgent, as the agentID of a lookup, matches every agent of the org (a
// caller not bound to one agent).
const AnyAgent = ""

// Get returns the org's wake-up (ErrNotFound for another org's). agentID
// narrows it to that agent's wake-ups (a caller bound to one agent): another
// agent's is ErrNotFound too; AnyAgent matches every agent.
func (s *Service) Get(ctx context.Context, orgID, agentID string, id uuid.UUID) (Wakeup, error) {
	w, err := scanWakeup(s.db.QueryRow(ctx, selectWakeup+` WHERE w.org_id = $1 AND w.id = $2 AND ($3 = '' OR w.agent_id = $3)`,
		orgID, id, agentID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Wakeup{}, ErrNotFound
	}
	if err != nil {
		return Wakeup{}, fmt.Errorf("read wake-up: %w", err)
	}
	return w, nil
}

// getByKey returns the agent's wake-up created under an idempotency key.
func (s *Service) getByKey(ctx context.Context, orgID, agentID, key string) (Wakeup, error) {
	w, err := scanWakeup(s.db.QueryRow(ctx, selectWakeup+` WHERE w.org_id = $1 AND w.agent_id = $2 AND w.idempotency_key = $3`,
		orgID, agentID, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Wakeup{}, ErrNotFound
	}
	if err != nil {
		return Wakeup{}, fmt.Errorf("read wake-up: %w", err)
	}
	return w, nil
}

// ListFilter narrows List.
type ListFilter struct {
	WorkflowID string
	AgentID    string // empty: every agent's
	Status     string // pending | delivered | failed
	// Delivery is the signal's delivery state: waiting (not yet queued),
	// queued, sent or undeliverable.
	Delivery string
}

// deliveryConds are the List conditions of each delivery state on the
// wake-up's signal message m (SPEC §5's state table).
var deliveryConds = map[string]string{
	DeliveryWaiting:       ` AND m.status IS NULL`,
	DeliveryQueued:        ` AND m.status = 'pending'`,
	DeliverySent:          ` AND m.status = 'delivered'`,
	DeliveryUndeliverable: ` AND m.status = 'failed'`,
}

// The wake-ups whose signal is not yet sent, or failed, are few beside
// the org's settled ones that retention keeps: a list of them starts from
// the open rows' partial indexes (wakeups_open, queue_messages_outbox_open,
// queue_messages_failed), not from the org's every wake-up, whose signal
// the status conditions would otherwise look up one by one. (A wake-up has
// a message once it resolves, keyed by its id: waiting is unresolved.)
const (
	openWaiting = `SELECT id FROM wakeups WHERE org_id = $1 AND state <> 'resolved'`
	openQueued  = `SELECT idempotency_key::uuid FROM queue_messages
	                WHERE org_id = $1 AND queue = '` + Queue + `' AND status = 'pending' AND signal_workflow_id IS NOT NULL`
	openFailed = `SELECT idempotency_key::uuid FROM queue_messages
	               WHERE org_id = $1 AND queue = '` + Queue + `' AND status = 'failed'`
)

// openRows narrows a list filtered to open wake-ups to the candidates the
// open rows name (the status and delivery conditions still decide).
func openRows(f ListFilter) string {
	switch {
	case f.Status == StatusFailed || f.Delivery == DeliveryUndeliverable:
		return ` AND w.id IN (` + openFailed + `)`
	case f.Delivery == DeliveryWaiting:
		return ` AND w.id IN (` + openWaiting + `)`
	case f.Delivery == DeliveryQueued:
		return ` AND w.id IN (` + openQueued + `)`
	case f.Status == StatusPending:
		return ` AND w.id IN (` + openWaiting + ` UNION ALL ` + openQueued + `)`
	}
	return ""
}

// List returns the org's wake-ups, newest first, after cursor (exclusive);
// next is the cursor of the following page, nil at the end.
func (s *Service) List(ctx context.Context, orgID string, f ListFilter, cursor *uuid.UUID, limit int) (items []Wakeup, next *uuid.UUID, err error) {
	inv := &apperr.InvalidError{}
	checkText(inv, "workflow_id", f.WorkflowID, false)
	checkText(inv, "agent_id", f.AgentID, false)
	switch f.Status {
	case "", StatusPending, StatusDelivered, StatusFailed:
	default:
		inv.Add("status", "must be pending, delivered or failed")
	}
	if _, ok := deliveryConds[f.Delivery]; f.Delivery != "" && !ok {
		inv.Add("delivery", "must be waiting, queued, sent or undeliverable")
	}
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	var statusCond string
	switch f.Status {
	case StatusPending:
		statusCond = ` AND (m.status IS NULL OR m.status = 'pending')`
	case StatusDelivered:
		statusCond = ` AND m.status = 'delivered'`
	case StatusFailed:
		statusCond = ` AND m.status = 'failed'`
	}
	rows, err := s.db.Query(ctx, selectWakeup+`
		WHERE w.org_id = $1 AND ($2 = '' OR w.workflow_id = $2) AND w.id < coalesce($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
		  AND ($5 = '' OR w.agent_id = $5)`+openRows(f)+statusCond+deliveryConds[f.Delivery]+`
		ORDER BY w.id DESC LIMIT $4`, orgID, f.WorkflowID, cursor, limit+1, f.AgentID)
	if err != nil {
		return nil, nil, fmt.Errorf("list wake-ups: %w", err)
	}
	items, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Wakeup, error) { return scanWakeup(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("list wake-ups: %w", err)
	}
	if len(items) > limit {
		items = items[:limit]
		last := items[limit-1].ID
		next = &last
	}
	return items, next, nil
}

// qAgentWork reports whether work $2 of org $1 was enqueued by a wake-up of
// agent $3. The work names its wake-up in its onComplete context
// (hookContext), so both rows are read by primary key; plain work, absent
// work and another agent's or org's match nothing alike. The CASE keeps the
// uuid cast away from another hook's context.
const qAgentWork = `
SELECT EXISTS (
  SELECT 1 FROM workpool_work w
    JOIN wakeups k ON k.org_id = w.org_id AND k.work_id = w.id
   WHERE w.org_id = $1 AND w.id = $2 AND k.agent_id = $3
     AND k.id = CASE WHEN w.on_complete_hook = '` + HookName + `' THEN (w.on_complete_context->>'wakeup_id')::uuid END)`

// WorkStatus is workpool's Status of work a wake-up enqueued, narrowed to
// agentID's wake-ups: work has an agent only through the wake-up that
// enqueued it, so plain work, and another agent's, is workpool.ErrNotFound
// as absent work is. AnyAgent is plain Status.
func (s *Service) WorkStatus(ctx context.Context, orgID, agentID string, workID uuid.UUID) (workpool.Status, error) {
	if agentID == AnyAgent {
		return s.pool.Status(ctx, orgID, workID)
	}
	var owned bool
	if err := s.db.QueryRow(ctx, qAgentWork, orgID, workID, agentID).Scan(&owned); err != nil {
		return workpool.Status{}, fmt.Errorf("read work %s of agent: %w", workID, err)
	}
	if !owned {
		return workpool.Status{}, workpool.ErrNotFound
	}
	return s.pool.Status(ctx, orgID, workID)
}

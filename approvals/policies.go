package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/page"
)

// PolicyParams set a standing policy.
type PolicyParams struct {
	AgentID  string
	ToolName string
	// Approval is always, once or never.
	Approval string
	// Match, when set, makes the policy conditional: a JSON object the call's
	// input must contain (jsonb @>). One policy per (agent, tool, match),
	// matches compared as JSON values.
	Match json.RawMessage
	// UpdatedBy is who set it (the token's sub).
	UpdatedBy string
}

// PutPolicy creates or replaces the policy for (org, agent, tool, match).
func (s *Service) PutPolicy(ctx context.Context, orgID string, p PolicyParams) (Policy, error) {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "agent_id", p.AgentID, MaxText)
	checkToolName(inv, "tool_name", p.ToolName)
	checkPolicy(inv, "approval", p.Approval, true)
	match := normalizeMatch(inv, p.Match, true)
	if err := inv.OrNil(); err != nil {
		return Policy{}, err
	}
	var pol Policy
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if match == nil {
			var err error
			pol, err = scanPolicy(tx.QueryRow(ctx, qUpsertUnconditionalPolicy, newID(), orgID, p.AgentID, p.ToolName, p.Approval, p.UpdatedBy))
			return err
		}
		if _, err := tx.Exec(ctx, qLockToolPolicyPuts, orgID, p.AgentID, p.ToolName); err != nil {
			return err
		}
		var n int
		var exists bool
		if err := tx.QueryRow(ctx, qCountConditionalPolicies, orgID, p.AgentID, p.ToolName, match).Scan(&n, &exists); err != nil {
			return err
		}
		if !exists && n >= MaxConditionalPolicies {
			return ErrTooManyPolicies
		}
		var err error
		pol, err = scanPolicy(tx.QueryRow(ctx, qPutConditionalPolicy, newID(), orgID, p.AgentID, p.ToolName, match, p.Approval, p.UpdatedBy))
		return err
	})
	switch {
	case errors.Is(err, ErrTooManyPolicies):
		return Policy{}, err
	case err != nil:
		return Policy{}, fmt.Errorf("setting tool policy: %w", err)
	}
	return pol, nil
}

// DeletePolicy removes the policy for (org, agent, tool, match); match nil
// names the unconditional one. ErrPolicyNotFound when there is none.
func (s *Service) DeletePolicy(ctx context.Context, orgID, agentID, toolName string, match json.RawMessage) error {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "agent_id", agentID, MaxText)
	checkToolName(inv, "tool_name", toolName)
	match = normalizeMatch(inv, match, false)
	if err := inv.OrNil(); err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, qDeletePolicy, orgID, agentID, toolName, match)
	if err != nil {
		return fmt.Errorf("deleting tool policy: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrPolicyNotFound
	}
	return nil
}

// ListPolicies returns a page of an agent's policies in creation order.
func (s *Service) ListPolicies(ctx context.Context, orgID, agentID string, p Page) ([]Policy, *uuid.UUID, error) {
	inv := &apperr.InvalidError{}
	checkSegment(inv, "agent_id", agentID, MaxText)
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, qListPolicies, orgID, agentID, p.After(), p.Size()+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing tool policies: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Policy, error) { return scanPolicy(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing tool policies: %w", err)
	}
	items, next := page.Trim(items, p.Size(), func(p Policy) uuid.UUID { return p.ID })
	return items, next, nil
}

// decidingPolicy returns the policy that decides a call (nil: none, so the
// call is asked about, as under "once").
func decidingPolicy(ctx context.Context, q db.Querier, orgID, agentID, tool string, input json.RawMessage) (*Policy, error) {
	p, err := scanPolicy(q.QueryRow(ctx, qDecidingPolicy, orgID, agentID, tool, input))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading tool policies: %w", err)
	}
	return &p, nil
}

// unconditionalPolicy returns the agent's unconditional policy for the
// tool, nil when there is none.
func unconditionalPolicy(ctx context.Context, q db.Querier, orgID, agentID, tool string) (*string, error) {
	var approval string
	err := q.QueryRow(ctx, qUnconditionalPolicy, orgID, agentID, tool).Scan(&approval)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading tool policy: %w", err)
	}
	return &approval, nil
}

func scanPolicy(row pgx.Row) (Policy, error) {
	var p Policy
	var match []byte
	err := row.Scan(&p.ID, &p.AgentID, &p.ToolName, &match, &p.Approval, &p.CreatedAt, &p.UpdatedAt, &p.UpdatedBy)
	if len(match) > 0 {
		p.Match = match
	}
	return p, err
}

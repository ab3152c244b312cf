package mandates

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/page"
)

// CreateParams is a new mandate.
type CreateParams struct {
	AgentID    string
	Scope      string
	Budget     int64
	ValidUntil *time.Time // nil: no end
}

// Create creates the mandate for (org, agent, scope) with nothing spent.
// ErrExists when one exists.
func (s *Service) Create(ctx context.Context, orgID string, p CreateParams) (Mandate, error) {
	inv := &apperr.InvalidError{}
	requireText(inv, "agent_id", p.AgentID)
	requireText(inv, "scope", p.Scope)
	checkAmount(inv, "budget", p.Budget)
	if err := inv.OrNil(); err != nil {
		return Mandate{}, err
	}
	m, err := scanMandate(s.db.QueryRow(ctx, qCreateMandate, newID(), orgID, p.AgentID, p.Scope, p.Budget, p.ValidUntil))
	if errors.Is(err, pgx.ErrNoRows) {
		return Mandate{}, ErrExists
	}
	if err != nil {
		return Mandate{}, fmt.Errorf("creating mandate: %w", err)
	}
	return m, nil
}

// Get returns one mandate. agentID narrows it to that agent's mandates (a
// caller bound to one agent): another agent's is ErrNotFound, as another
// org's is; AnyAgent matches every agent of the org.
func (s *Service) Get(ctx context.Context, orgID, agentID string, id uuid.UUID) (Mandate, error) {
	return s.getBy(ctx, qGetMandate, orgID, id, agentID)
}

// Find returns the mandate of (org, agent, scope).
func (s *Service) Find(ctx context.Context, orgID, agentID, scope string) (Mandate, error) {
	return s.getBy(ctx, qFindMandate, orgID, agentID, scope)
}

func (s *Service) getBy(ctx context.Context, query string, args ...any) (Mandate, error) {
	m, err := scanMandate(s.db.QueryRow(ctx, query, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Mandate{}, ErrNotFound
	}
	if err != nil {
		return Mandate{}, fmt.Errorf("reading mandate: %w", err)
	}
	return m, nil
}

// MandateFilter narrows List; empty fields match everything.
type MandateFilter struct {
	AgentID string
	Scope   string
}

// List returns a page of the org's mandates in id (creation) order, and the
// cursor of the next page (nil at the end).
func (s *Service) List(ctx context.Context, orgID string, f MandateFilter, p Page) ([]Mandate, *uuid.UUID, error) {
	inv := &apperr.InvalidError{}
	checkText(inv, "agent_id", f.AgentID)
	checkText(inv, "scope", f.Scope)
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, qListMandates, orgID, f.AgentID, f.Scope, p.After(), p.Size()+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing mandates: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Mandate, error) { return scanMandate(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing mandates: %w", err)
	}
	items, next := page.Trim(items, p.Size(), func(m Mandate) uuid.UUID { return m.ID })
	return items, next, nil
}

// PatchParams changes a mandate; nil fields stay as they are.
type PatchParams struct {
	Budget *int64
	Status *string
	// SetValidUntil applies ValidUntil (nil then clears the end date).
	SetValidUntil bool
	ValidUntil    *time.Time
}

// Patch changes budget, status or valid_until. Lowering the budget below
// spent is allowed: the mandate then refuses until it is raised again.
// agentID narrows it as in Get.
func (s *Service) Patch(ctx context.Context, orgID, agentID string, id uuid.UUID, p PatchParams) (Mandate, error) {
	inv := &apperr.InvalidError{}
	if p.Budget != nil {
		checkAmount(inv, "budget", *p.Budget)
	}
	if p.Status != nil && *p.Status != StatusActive && *p.Status != StatusRevoked {
		inv.Add("status", "must be active or revoked")
	}
	if err := inv.OrNil(); err != nil {
		return Mandate{}, err
	}
	m, err := scanMandate(s.db.QueryRow(ctx, qPatchMandate, orgID, id, p.Budget, p.Status, p.SetValidUntil, p.ValidUntil, agentID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Mandate{}, ErrNotFound
	}
	if err != nil {
		return Mandate{}, fmt.Errorf("updating mandate: %w", err)
	}
	return m, nil
}

// Ledger returns a page of a mandate's ledger in commit order, and the
// cursor of the next page (nil at the end). ErrNotFound for an absent
// mandate; agentID narrows it as in Get.
func (s *Service) Ledger(ctx context.Context, orgID, agentID string, mandateID uuid.UUID, p Page) ([]LedgerEntry, *uuid.UUID, error) {
	if _, err := s.Get(ctx, orgID, agentID, mandateID); err != nil {
		return nil, nil, err
	}
	rows, err := s.db.Query(ctx, qLedger, orgID, mandateID, p.After(), p.Size()+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing ledger: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerEntry, error) { return scanLedgerEntry(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing ledger: %w", err)
	}
	items, next := page.Trim(items, p.Size(), func(e LedgerEntry) uuid.UUID { return e.ID })
	return items, next, nil
}

func scanMandate(row pgx.Row) (Mandate, error) {
	var m Mandate
	err := row.Scan(&m.ID, &m.OrgID, &m.AgentID, &m.Scope, &m.Budget, &m.Spent, &m.Status, &m.ValidUntil, &m.CreatedAt, &m.UpdatedAt)
	return m, err
}

func scanLedgerEntry(row pgx.Row) (LedgerEntry, error) {
	var e LedgerEntry
	var key *string
	var approval pgtype.UUID
	if err := row.Scan(&e.ID, &e.MandateID, &e.Kind, &e.Amount, &e.Reason, &key, &approval, &e.CreatedAt); err != nil {
		return e, err
	}
	e.IdempotencyKey = deref(key)
	if approval.Valid {
		id := uuid.UUID(approval.Bytes)
		e.ApprovalID = &id
	}
	return e, nil
}

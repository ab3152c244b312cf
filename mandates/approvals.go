package mandates

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/page"
)

// Resolution is what a resolve hook learns about a resolved request.
type Resolution struct {
	ApprovalID uuid.UUID
	OrgID      string
	AgentID    string
	Scope      string
	Cost       int64
	// State is approved, denied or expired.
	State      string
	Payload    Payload
	ResolvedBy string
	Note       string
}

// ResolveHook reacts to the resolution of a request whose payload has its
// kind. It runs inside the resolving transaction: its writes commit with the
// resolution, and its error rolls the resolution back.
type ResolveHook func(ctx context.Context, tx pgx.Tx, r Resolution) error

// RegisterResolveHook sets the hook for payload kind (replacing any earlier
// one). Register hooks before requests of that kind can be resolved.
func (s *Service) RegisterResolveHook(kind string, h ResolveHook) {
	s.hooksMu.Lock()
	defer s.hooksMu.Unlock()
	s.hooks[kind] = h
}

func (s *Service) hook(kind string) (ResolveHook, bool) {
	s.hooksMu.RLock()
	defer s.hooksMu.RUnlock()
	h, ok := s.hooks[kind]
	return h, ok
}

// Approve approves a pending request: its cost is charged as an
// approved_overrun (to a new budget-0 mandate when none exists) and the
// payload's hook is called, all in one transaction. Errors: ErrApprovalNotFound,
// ErrSelfApproval, ErrAlreadyResolved (also when it had expired: it is then
// resolved as expired), ErrSpentBeyondMax (the charge would take the
// mandate's spent past MaxAmount: nothing changes, the request stays
// pending).
func (s *Service) Approve(ctx context.Context, orgID string, id uuid.UUID, resolverSub, note string) (Approval, error) {
	return s.resolve(ctx, orgID, id, StateApproved, resolverSub, note)
}

// Deny denies a pending request and calls the payload's hook with the
// denial. Errors as Approve.
func (s *Service) Deny(ctx context.Context, orgID string, id uuid.UUID, resolverSub, note string) (Approval, error) {
	return s.resolve(ctx, orgID, id, StateDenied, resolverSub, note)
}

func (s *Service) resolve(ctx context.Context, orgID string, id uuid.UUID, state, resolverSub, note string) (Approval, error) {
	inv := &apperr.InvalidError{}
	// (the note rides in every event, webhook and list page of the request)
	checkInputText(inv, "note", note)
	if err := inv.OrNil(); err != nil {
		return Approval{}, err
	}
	ctx, committed := db.WithAfterCommit(ctx)
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return Approval{}, fmt.Errorf("beginning resolution: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	a, err := s.resolveTx(ctx, tx, orgID, id, state, resolverSub, note)
	if errors.Is(err, errExpiredWhilePending) {
		// Too late to approve or deny: resolve it as the sweeper would, and
		// report the conflict.
		if _, err := s.resolveTx(ctx, tx, orgID, id, StateExpired, "", ""); err != nil {
			return Approval{}, err
		}
		if err := tx.Commit(ctx); err != nil {
			return Approval{}, fmt.Errorf("committing expiry: %w", err)
		}
		committed.Run()
		s.metrics.resolve(StateExpired)
		return Approval{}, fmt.Errorf("%w (it expired)", ErrAlreadyResolved)
	}
	if err != nil {
		return Approval{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Approval{}, fmt.Errorf("committing resolution: %w", err)
	}
	committed.Run()
	s.metrics.resolve(state)
	return a, nil
}

// errExpiredWhilePending: approve or deny found the request pending but
// past expires_at.
var errExpiredWhilePending = errors.New("approval request expired while pending")

// resolveTx moves a request from pending to state, charges an approval and
// calls the hook.
func (s *Service) resolveTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, state, resolverSub, note string) (Approval, error) {
	a, err := scanApproval(tx.QueryRow(ctx, qResolve, orgID, id, state, resolverSub, note, state == StateExpired))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, s.diagnose(ctx, tx, orgID, id, resolverSub)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("resolving approval request: %w", err)
	}
	if state == StateApproved {
		if err := s.chargeTx(ctx, tx, a); err != nil {
			return Approval{}, err
		}
	}
	if a.OnResolve != nil {
		h, ok := s.hook(a.OnResolve.Kind)
		if !ok {
			return Approval{}, fmt.Errorf("%w %q", ErrNoHook, a.OnResolve.Kind)
		}
		r := Resolution{ApprovalID: a.ID, OrgID: a.OrgID, AgentID: a.AgentID, Scope: a.Scope, Cost: a.Cost,
			State: state, Payload: *a.OnResolve, ResolvedBy: a.ResolvedBy, Note: a.Note}
		if err := h(ctx, tx, r); err != nil {
			return Approval{}, fmt.Errorf("resolve hook %q: %w", a.OnResolve.Kind, err)
		}
	}
	// Last, so that the org's event counter is locked only until commit,
	// not across the hook.
	if err := s.appendEvent(ctx, tx, inbox.TypeResolved, a); err != nil {
		return Approval{}, err
	}
	return a, nil
}

// chargeTx charges an approved request's cost as an approved_overrun, or
// refuses with ErrSpentBeyondMax when that would take the mandate's spent
// past MaxAmount; the caller's transaction then rolls the approval back, so
// the request stays pending and can still be denied.
func (s *Service) chargeTx(ctx context.Context, tx pgx.Tx, a Approval) error {
	tag, err := tx.Exec(ctx, qCharge, newID(), a.OrgID, a.AgentID, a.Scope, a.Cost, newID(), a.Reason, a.ID, int64(MaxAmount))
	if err != nil {
		return fmt.Errorf("charging approved overrun: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var spent int64
	if err := tx.QueryRow(ctx, qChargeRefused, a.OrgID, a.AgentID, a.Scope).Scan(&spent); err != nil {
		return fmt.Errorf("reading the spent that refused an approved overrun: %w", err)
	}
	return fmt.Errorf("%w (it has spent %d; this request costs %d)", ErrSpentBeyondMax, spent, a.Cost)
}

// diagnose says why the compare-and-set from pending matched nothing.
func (s *Service) diagnose(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, resolverSub string) error {
	var state, requestedBy string
	var expired bool
	err := tx.QueryRow(ctx, qResolveDiagnose, orgID, id).Scan(&state, &requestedBy, &expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrApprovalNotFound
	case err != nil:
		return fmt.Errorf("reading approval request: %w", err)
	case requestedBy != "" && requestedBy == resolverSub:
		return ErrSelfApproval
	case state != StatePending:
		return fmt.Errorf("%w (it is %s)", ErrAlreadyResolved, state)
	case expired:
		return errExpiredWhilePending
	}
	// Pending and not yet expired, yet not matched: expiry asked too early.
	return fmt.Errorf("%w: approval request not yet expired", apperr.ErrConflict)
}

// CancelApprovalTx withdraws a pending request for its caller (canceled);
// no hook is called, as the caller is the one withdrawing. It reports false
// when the request was not pending (or does not exist). Its count waits for
// tx's commit when ctx carries db.WithAfterCommit's collector.
func (s *Service) CancelApprovalTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID) (bool, error) {
	a, err := scanApproval(tx.QueryRow(ctx, qCancelApproval, orgID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("canceling approval request: %w", err)
	}
	// The inbox learns that the request no longer waits for anyone.
	if err := s.appendEvent(ctx, tx, inbox.TypeResolved, a); err != nil {
		return false, err
	}
	// (counted once tx commits, when the caller's ctx says when)
	db.CountAfterCommit(ctx, func() { s.metrics.resolve(StateCanceled) })
	return true, nil
}

// GetApproval returns one request. agentID narrows it to that agent's
// requests as in Get.
func (s *Service) GetApproval(ctx context.Context, orgID, agentID string, id uuid.UUID) (Approval, error) {
	a, err := scanApproval(s.db.QueryRow(ctx, qGetApproval, orgID, id, agentID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, ErrApprovalNotFound
	}
	if err != nil {
		return Approval{}, fmt.Errorf("reading approval request: %w", err)
	}
	return a, nil
}

// ApprovalFilter narrows ListApprovals; empty fields match everything.
type ApprovalFilter struct {
	State   string
	AgentID string
	// NewestFirst lists in reverse creation order: a cursor then continues
	// towards older requests. A reader after the newest (an inbox) reads a
	// page or two instead of the whole history.
	NewestFirst bool
}

// ListApprovals returns a page of the org's requests in id (creation)
// order, or newest first, and the cursor of the next page (nil at the end).
func (s *Service) ListApprovals(ctx context.Context, orgID string, f ApprovalFilter, p Page) ([]Approval, *uuid.UUID, error) {
	switch f.State {
	case "", StatePending, StateApproved, StateDenied, StateExpired, StateCanceled:
	default:
		return nil, nil, apperr.Invalid("status", "must be one of pending, approved, denied, expired, canceled")
	}
	inv := &apperr.InvalidError{}
	checkText(inv, "agent_id", f.AgentID)
	if err := inv.OrNil(); err != nil {
		return nil, nil, err
	}
	list := qListApprovals
	if f.NewestFirst {
		list = qListApprovalsNewestFirst
	}
	rows, err := s.db.Query(ctx, list, orgID, f.State, f.AgentID, p.After(), p.Size()+1)
	if err != nil {
		return nil, nil, fmt.Errorf("listing approval requests: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Approval, error) { return scanApproval(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing approval requests: %w", err)
	}
	items, next := page.Trim(items, p.Size(), func(a Approval) uuid.UUID { return a.ID })
	return items, next, nil
}

func scanApproval(row pgx.Row) (Approval, error) {
	var a Approval
	var kind string
	var data []byte
	var resolvedAt *time.Time
	var resolvedBy, note *string
	err := row.Scan(&a.ID, &a.OrgID, &a.AgentID, &a.Scope, &a.Cost, &a.Reason, &a.State, &a.RequestedBy, &a.Refusal,
		&kind, &data, &a.ExpiresAt, &a.CreatedAt, &resolvedAt, &resolvedBy, &note, &a.Budget, &a.Spent)
	if err != nil {
		return Approval{}, err
	}
	if kind != "" {
		a.OnResolve = &Payload{Kind: kind, Data: data}
	}
	a.ResolvedAt, a.ResolvedBy, a.Note = resolvedAt, deref(resolvedBy), deref(note)
	return a, nil
}

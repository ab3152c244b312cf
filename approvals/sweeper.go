package approvals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/workflows/signals"
)

// sweepBatch bounds one scan for expired requests.
const sweepBatch = 100

// SweeperLeadership names the expiry sweeper's leadership (internal/leader).
const SweeperLeadership = "approvals.sweeper"

// Start runs the expiry sweeper on whichever replica holds its leadership
// (internal/leader); the others stand by. It returns at once, and starts
// once.
func (s *Service) Start(ctx context.Context) error {
	el := &leader.Elector{DB: s.db, Name: SweeperLeadership, Retry: s.cfg.LeaderRetry, Logger: s.logger}
	sweep := func(ctx context.Context) error { _, err := s.Sweep(ctx); return err }
	logFailure := func(err error) {
		s.metrics.sweepErrs.Inc()
		s.logger.Warn("sweeping expired tool approvals failed", "error", err.Error())
	}
	return s.sweeper.Start(ctx, el, leader.Every(s.cfg.SweepInterval, sweep, logFailure))
}

// Stop stops the sweeper and waits for it (until ctx ends). Stopping twice,
// or without Start, is safe.
func (s *Service) Stop(ctx context.Context) error { return s.sweeper.Stop(ctx) }

// Sweep expires every pending request past its expires_at, each in its own
// transaction — denied with reason "expired": the session's events and the
// workflow's signal as for a human's denial — and returns how many it
// expired. The sweeper calls it with its leadership's term in ctx, which
// fences each transaction: once another replica has taken the leadership,
// Sweep writes nothing and returns leader.ErrDeposed. Tests and tools may
// call it without a term.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	return leader.SweepBatches(ctx, sweepBatch, s.expiredApprovals, s.expire, func(d dueApproval, err error) {
		s.metrics.sweepErrs.Inc()
		s.logger.Error("expiring tool approval failed", "org_id", d.orgID, "approval_id", d.id.String(), "error", err.Error())
	})
}

type dueApproval struct {
	orgID, sessionID string
	id               uuid.UUID
	expiresAt        time.Time // with id, its place in the sweep's order
}

func (s *Service) expiredApprovals(ctx context.Context, after *dueApproval, batch int) ([]dueApproval, error) {
	from := dueApproval{expiresAt: time.Unix(0, 0)} // before any request
	if after != nil {
		from = *after
	}
	rows, err := s.db.Query(ctx, qExpiredApprovals, batch, from.expiresAt, from.id)
	if err != nil {
		return nil, fmt.Errorf("scanning for expired tool approvals: %w", err)
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dueApproval, error) {
		var d dueApproval
		return d, r.Scan(&d.orgID, &d.sessionID, &d.id, &d.expiresAt)
	})
	if err != nil {
		return nil, fmt.Errorf("scanning for expired tool approvals: %w", err)
	}
	return due, nil
}

// expire resolves one request as expired; one resolved meanwhile (by a
// human or another sweeper) is skipped (false).
func (s *Service) expire(ctx context.Context, d dueApproval) (bool, error) {
	var r resolved
	err := leader.FencedTx(ctx, s.db, func(tx pgx.Tx) error {
		var agent string
		if err := tx.QueryRow(ctx, qLockSession, d.orgID, d.sessionID).Scan(&agent); err != nil {
			return fmt.Errorf("locking session: %w", err)
		}
		var err error
		if r, err = resolveTx(ctx, tx, d.orgID, d.id, qExpire, d.orgID, d.id); err != nil {
			return err
		}
		if err := queueDecision(ctx, tx, d.orgID, d.id, r, DecisionDenied, SourceExpired, signals.ReasonExpired); err != nil {
			return err
		}
		err = appendEvents(ctx, tx, d.orgID, d.sessionID,
			newEvent{EventResolved, map[string]any{"approval_id": d.id, "tool_name": r.tool, "decision": DecisionDenied,
				"source": SourceExpired, "reason": signals.ReasonExpired, "updated_policy": nil}},
			newEvent{EventDenied, map[string]any{"approval_id": d.id, "tool_name": r.tool, "reason": signals.ReasonExpired}})
		if err != nil {
			return err
		}
		return s.appendInbox(ctx, tx, inbox.TypeResolved, d.orgID, d.id)
	})
	switch {
	case errors.Is(err, ErrAlreadyResolved):
		return false, nil
	case err != nil:
		return false, err
	}
	s.metrics.resolved(SourceExpired, DecisionDenied, r.resolvedAt.Sub(r.createdAt))
	return true, nil
}

package mandates

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/leader"
)

// sweepBatch bounds one scan for expired requests.
const sweepBatch = 100

// SweeperLeadership names the expiry sweeper's leadership (internal/leader).
const SweeperLeadership = "mandates.sweeper"

// Start runs the expiry sweeper on whichever replica holds its leadership
// (internal/leader); the others stand by. It returns at once, and starts
// once.
func (s *Service) Start(ctx context.Context) error {
	el := &leader.Elector{DB: s.db, Name: SweeperLeadership, Retry: s.cfg.LeaderRetry, Logger: s.logger}
	sweep := func(ctx context.Context) error { _, err := s.Sweep(ctx); return err }
	logFailure := func(err error) {
		s.metrics.sweepErrs.Inc()
		s.logger.Warn("sweeping expired approval requests failed", "error", err.Error())
	}
	return s.sweeper.Start(ctx, el, leader.Every(s.cfg.SweepInterval, sweep, logFailure))
}

// Stop stops the sweeper and waits for it and for the spend batches under
// way (until ctx ends: then it cancels the batches still running, whose
// spends are decided or not as their commits went). Stopping twice, or
// without Start, is safe.
func (s *Service) Stop(ctx context.Context) error {
	err := s.sweeper.Stop(ctx)
	if s.batcher != nil {
		err = errors.Join(err, s.batcher.drains.Wait(ctx))
	}
	return err
}

// Sweep expires every pending request past its expires_at, each in its own
// transaction with its hook (as a denial, state expired), and returns how
// many it expired. A request whose hook fails is logged and left pending
// for the next sweep. The sweeper calls it with its leadership's term in
// ctx, which fences each transaction: once another replica has taken the
// leadership, Sweep writes nothing and returns leader.ErrDeposed. Tests
// and tools may call it without a term.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	return leader.SweepBatches(ctx, sweepBatch, s.expiredApprovals, s.expire, func(d dueApproval, err error) {
		s.metrics.sweepErrs.Inc()
		s.logger.Error("expiring approval request failed", "org_id", d.orgID, "approval_id", d.id.String(), "error", err.Error())
	})
}

type dueApproval struct {
	orgID     string
	id        uuid.UUID
	expiresAt time.Time // with id, its place in the sweep's order
}

func (s *Service) expiredApprovals(ctx context.Context, after *dueApproval, batch int) ([]dueApproval, error) {
	from := dueApproval{expiresAt: time.Unix(0, 0)} // before any request
	if after != nil {
		from = *after
	}
	rows, err := s.db.Query(ctx, qExpiredApprovals, batch, from.expiresAt, from.id)
	if err != nil {
		return nil, fmt.Errorf("scanning for expired approval requests: %w", err)
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dueApproval, error) {
		var d dueApproval
		return d, r.Scan(&d.orgID, &d.id, &d.expiresAt)
	})
	if err != nil {
		return nil, fmt.Errorf("scanning for expired approval requests: %w", err)
	}
	return due, nil
}

// expire resolves one request as expired; one already resolved (by a
// concurrent approver, a cancel or another sweeper) is skipped, and not
// counted: Sweep returns how many it expired.
func (s *Service) expire(ctx context.Context, d dueApproval) (bool, error) {
	ctx, committed := db.WithAfterCommit(ctx)
	err := leader.FencedTx(ctx, s.db, func(tx pgx.Tx) error {
		_, err := s.resolveTx(ctx, tx, d.orgID, d.id, StateExpired, "", "")
		return err
	})
	switch {
	case err == nil:
		committed.Run()
		s.metrics.resolve(StateExpired)
		return true, nil
	case errors.Is(err, ErrAlreadyResolved), errors.Is(err, ErrApprovalNotFound):
		return false, nil
	}
	return false, err
}

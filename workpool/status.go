package workpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Status reports where a work item stands; ErrNotFound when it is absent,
// purged, or another org's.
func (m *Manager) Status(ctx context.Context, orgID string, id uuid.UUID) (Status, error) {
	return m.StatusTx(ctx, m.db, orgID, id)
}

// StatusTx is Status through q (a transaction or the pool).
func (m *Manager) StatusTx(ctx context.Context, q Querier, orgID string, id uuid.UUID) (Status, error) {
	var (
		s       Status
		state   string
		outcome *string
		errText *string
	)
	err := q.QueryRow(ctx, sqlStatus, id, orgID).Scan(&s.ID, &s.OrgID, &s.Pool, &s.Handler, &state, &s.Attempts,
		&s.Canceled, &outcome, &s.Result, &errText, &s.RunAt, &s.CreatedAt, &s.FinishedAt, &s.ConcurrencyKey, &s.KeyLimit)
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, ErrNotFound
	}
	if err != nil {
		return Status{}, fmt.Errorf("reading work %s: %w", id, err)
	}
	s.PreviousAttempts = s.Attempts
	switch state {
	case "pending":
		s.State = StatePending
	case "running":
		s.State = StateRunning
	default:
		s.State = StateFinished
	}
	if outcome != nil {
		s.Outcome = Outcome(*outcome)
	}
	if errText != nil && s.State == StateFinished {
		s.Error = *errText
	}
	if s.State != StateFinished {
		s.Result = nil
	}
	return s, nil
}

// Cancel asks for work to be canceled: pending work finishes as canceled
// without running; running work has its handler's context canceled on
// whichever replica runs it and finishes as canceled whatever the handler
// returns. Finished, absent or another org's work: a no-op.
func (m *Manager) Cancel(ctx context.Context, orgID string, id uuid.UUID) error {
	return pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error { return m.CancelTx(ctx, tx, orgID, id) })
}

// CancelTx is Cancel inside the caller's transaction.
func (m *Manager) CancelTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID) error {
	rows, err := tx.Query(ctx, sqlCancel, id, orgID, m.now())
	if err != nil {
		return fmt.Errorf("canceling work %s: %w", id, err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("canceling work %s: %w", id, err)
	}
	return nil
}

// CancelAll cancels orgID's unfinished work in pool that was created before
// before, returning how many cancelations it requested.
func (m *Manager) CancelAll(ctx context.Context, orgID, pool string, before time.Time) (int, error) {
	var n int64
	err := pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlCancelAll, orgID, pool, before, m.now()).Scan(&n); err != nil {
			return fmt.Errorf("canceling work in %s: %w", pool, err)
		}
		if n == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, sqlNotify, "k:"+pool); err != nil {
			return fmt.Errorf("waking pool %s: %w", pool, err)
		}
		return nil
	})
	return int(n), err
}

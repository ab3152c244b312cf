package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An approval that waited for the request's row past expires_at (held by a
// resolution that then rolled back: a failing hook, a charge refused past
// MaxAmount, a wake-up cancel that failed) is decided after the request
// expired, and is refused. qResolve compared expires_at with
// statement_timestamp(), read before the wait: it was approved and
// charged, its resolved_at dated before the expiry.
func TestAnApprovalThatWaitedForTheRequestPastExpiresAtIsRefused(t *testing.T) {
	s, db := newTestService(t, Config{ApprovalTTL: 500 * time.Millisecond})
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 0)
	id := refuse(t, s, "org-a", "llm", 5, "agent-sub")
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)

	tx, err := db.Begin(ctx) // another resolution of the request, in progress
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM mandate_approvals WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { _, err := s.Approve(ctx, "org-a", id, "human", ""); done <- err }()
	require.Eventually(t, func() bool { return lockWaiters(t, db) > 0 }, testWait, pollEvery)
	time.Sleep(time.Until(a.ExpiresAt) + 300*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx)) // it failed and rolled back
	err = <-done

	got, gerr := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, gerr)
	t.Logf("expires_at %s, resolved_at %v, state %s, spent %d, hook %v",
		got.ExpiresAt.UTC().Format(time.RFC3339Nano), got.ResolvedAt, got.State, mustGet(t, s, "org-a", m).Spent, len(rec.snapshot()))
	require.ErrorIs(t, err, ErrAlreadyResolved, "approved %s after the request expired", time.Since(got.ExpiresAt).Round(time.Millisecond))
	require.Equal(t, StateExpired, got.State)
	require.Zero(t, mustGet(t, s, "org-a", m).Spent)
}

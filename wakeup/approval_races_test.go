package wakeup

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/mandates"
)

// refuseOne asks for a wake-up its mandate refuses and returns the
// refusal (its approval request and its wake-up).
func (f *fixture) refuseOne(t *testing.T) *RefusedError {
	t.Helper()
	p := params("")
	p.Cost = 50
	p.RequestedBy = "agent-sub"
	_, err := f.svc.Create(context.Background(), p)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	return refused
}

// settled reads a raced refusal's approval request and wake-up and, when
// the approve won (aerr nil), checks it is approved and its work enqueued;
// the caller checks the other way.
func (f *fixture) settled(t *testing.T, r *RefusedError, aerr error) (mandates.Approval, Wakeup) {
	t.Helper()
	ctx := context.Background()
	a, err := f.mandates.GetApproval(ctx, "o", "", r.ApprovalID)
	require.NoError(t, err)
	w, err := f.svc.Get(ctx, "o", AnyAgent, r.Wakeup.ID)
	require.NoError(t, err)
	if aerr == nil {
		require.Equal(t, "approved", a.State)
		require.NotNil(t, w.WorkID)
	}
	return a, w
}

// An approve and a cancel of the wake-up that waits on it, at once: either
// the approval wins (approved, its work enqueued) or the cancel does (the
// request canceled, the wake-up resolved canceled, nothing run); never an
// approved request beside a canceled wake-up.
func TestAnApproveRacingACancelSettlesOneWay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for round := 0; round < 10; round++ {
		r := f.refuseOne(t)
		var wg sync.WaitGroup
		var aerr, cerr error
		wg.Add(2)
		go func() { defer wg.Done(); _, aerr = f.mandates.Approve(ctx, "o", r.ApprovalID, "bob", "") }()
		go func() { defer wg.Done(); _, cerr = f.svc.Cancel(ctx, "o", AnyAgent, r.Wakeup.ID) }()
		wg.Wait()
		require.NoError(t, cerr)
		if a, w := f.settled(t, r, aerr); aerr != nil {
			require.Equal(t, "canceled", a.State)
			require.Equal(t, "resolved", f.state(t, r.Wakeup.ID))
			require.Equal(t, OutcomeCanceled, w.Outcome)
		}
	}
}

// An approve racing the sweeper at the request's expiry: approved and
// enqueued, or expired (409) and the wake-up denied; every overrun charge
// has its work.
func TestAnApproveRacingExpirySettlesOneWay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		r := f.refuseOne(t)
		_, err := f.db.Exec(ctx, `UPDATE mandate_approvals SET expires_at = clock_timestamp() + interval '3 millisecond' WHERE id = $1`, r.ApprovalID)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var aerr error
		wg.Add(2)
		go func() { defer wg.Done(); _, aerr = f.mandates.Approve(ctx, "o", r.ApprovalID, "bob", "") }()
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, err := f.mandates.Sweep(ctx); err != nil {
					t.Errorf("sweep: %v", err)
				}
			}
		}()
		wg.Wait()
		if a, w := f.settled(t, r, aerr); aerr != nil {
			require.ErrorIs(t, aerr, mandates.ErrAlreadyResolved)
			require.Equal(t, "expired", a.State)
			require.Equal(t, OutcomeDenied, w.Outcome)
		}
	}
	var ledger, works int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM mandate_ledger WHERE kind='approved_overrun'`).Scan(&ledger))
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work`).Scan(&works))
	require.Equal(t, ledger, works)
}

// An approved overrun's work is enqueued whatever the org's pending cap:
// the human's decision is not refused for load.
func TestAnApprovalAtThePendingCapStillEnqueues(t *testing.T) {
	f := newFixtureCapped(t, 1)
	ctx := context.Background()
	r := f.refuseOne(t)
	_, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)
	_, err = f.svc.Create(ctx, params(""))
	require.Error(t, err)
	a, err := f.mandates.Approve(ctx, "o", r.ApprovalID, "bob", "")
	require.NoError(t, err)
	require.Equal(t, "approved", a.State)
	require.Equal(t, "enqueued", f.state(t, r.Wakeup.ID))
	require.EqualValues(t, 53, f.spent(t))
}

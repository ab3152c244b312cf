package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A spend that waits for a PATCH renewing the mandate (valid_until moved
// later, committed after the old end) is decided on the renewed mandate:
// it is charged, as the same spend a moment later is. The debit compared
// the decision's time with valid_until of the row from the statement's
// snapshot (the old end), the refusal with the locked row (the new end):
// the spend was refused as "insufficient" with more than its cost left,
// and an approval request raised for it.
func TestASpendThatWaitedForARenewalIsCharged(t *testing.T) {
	for _, batch := range []int{1, 64} {
		t.Run(map[int]string{1: "alone", 64: "batched"}[batch], func(t *testing.T) {
			s, db := newTestService(t, Config{MaxSpendBatch: batch})
			ctx := context.Background()
			until := time.Now().Add(400 * time.Millisecond)
			m, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 10, ValidUntil: &until})
			require.NoError(t, err)

			renewed := time.Now().Add(time.Hour)
			tx, err := db.Begin(ctx) // an operator's PATCH valid_until, under way
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, qPatchMandate, "org-a", m.ID, nil, nil, true, renewed, "")
			require.NoError(t, err)

			answer := spendBehindLock(t, s, db, "the PATCH")
			time.Sleep(time.Until(until) + 200*time.Millisecond)
			require.NoError(t, tx.Commit(ctx)) // renewed for an hour
			got, err := answer()
			require.NoError(t, err)
			t.Logf("ok=%v refusal=%q remaining=%d", got.OK, got.Refusal, got.Remaining)
			require.True(t, got.OK, "refused (%s, %d left) a spend of 5 on a mandate renewed for an hour", got.Refusal, got.Remaining)
			require.EqualValues(t, 5, mustGet(t, s, "org-a", m).Spent)
		})
	}
}

// The refusal agrees with the debit: a spend refused as "insufficient"
// never reports as left at least what it asked for. A spend arriving while
// a budget raise (or a refund) holds the row is judged by the debit on the
// row from before the raise, without waiting, and by the refusal on the row
// after it: refused as insufficient, "remaining 10" for a cost of 5, and
// its approval request shows a spend within budget.
func TestAnInsufficientRefusalNeverHasTheCostLeft(t *testing.T) {
	s, db := newTestService(t, Config{MaxSpendBatch: 1})
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 10, Reason: "r"})
	require.NoError(t, err)
	require.True(t, r.OK)

	tx, err := db.Begin(ctx) // PATCH budget 20, under way
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	budget := int64(20)
	_, err = tx.Exec(ctx, qPatchMandate, "org-a", m.ID, &budget, nil, false, nil, "")
	require.NoError(t, err)
	answer := spendBehindLock(t, s, db, "the PATCH")
	require.NoError(t, tx.Commit(ctx))
	got, err := answer()
	require.NoError(t, err)
	t.Logf("ok=%v refusal=%q remaining=%d", got.OK, got.Refusal, got.Remaining)
	if !got.OK {
		require.Less(t, got.Remaining, int64(5), "refused as %s with %d left for a cost of 5", got.Refusal, got.Remaining)
	}
}

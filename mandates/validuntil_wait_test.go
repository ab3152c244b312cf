package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A spend that waited for the mandate's row past valid_until (held by a
// PATCH, a refund, another replica's batch) is decided after the mandate
// ended: it is refused as expired, as the same spend arriving a moment
// later is. The debit compared valid_until with now(), read when the
// statement (or its batch's transaction) began, before the wait: it was
// charged, its ledger row dated before the end.
func TestASpendThatWaitedForTheMandatePastValidUntilIsRefusedAsExpired(t *testing.T) {
	for _, batch := range []int{1, 64} {
		t.Run(map[int]string{1: "alone", 64: "batched"}[batch], func(t *testing.T) {
			s, db := newTestService(t, Config{MaxSpendBatch: batch})
			ctx := context.Background()
			until := time.Now().Add(400 * time.Millisecond)
			m, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 10, ValidUntil: &until})
			require.NoError(t, err)
			tx := lockMandate(t, db, m.ID) // e.g. a PATCH, a refund, another replica's batch
			answer := spendBehindLock(t, s, db, "the row")
			time.Sleep(time.Until(until) + 300*time.Millisecond)
			require.NoError(t, tx.Rollback(ctx))
			r, err := answer()
			require.NoError(t, err)
			got := mustGet(t, s, "org-a", m)
			t.Logf("decided at %s, valid_until %s: ok=%v refusal=%q spent=%d",
				got.UpdatedAt.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano), r.OK, r.Refusal, got.Spent)
			require.False(t, r.OK, "debited %s after the mandate ended", time.Since(until).Round(time.Millisecond))
			require.Equal(t, RefusalExpired, r.Refusal)
			require.Zero(t, got.Spent)
		})
	}
}

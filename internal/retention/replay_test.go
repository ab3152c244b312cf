package retention

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

// Through the mandates service itself: a spend key inside its window still
// replays after a pass — a granted spend debits nothing again, a refused
// one answers with its first approval request, resolved and past its own
// retention though that request is — and once the key is past its window
// both go, and the key decides afresh.
func TestASpendKeyInsideItsWindowStillReplaysAfterAPass(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	svc := mandates.New(db, mandates.Config{Logger: testkit.Logger(t)})
	m, err := svc.Create(ctx, "org-a", mandates.CreateParams{AgentID: "a1", Scope: "llm", Budget: 10})
	require.NoError(t, err)
	granted := mandates.SpendParams{OrgID: "org-a", AgentID: "a1", Scope: "llm", Cost: 4, IdempotencyKey: "granted"}
	refused := mandates.SpendParams{OrgID: "org-a", AgentID: "a1", Scope: "llm", Cost: 100, IdempotencyKey: "refused", RequestedBy: "agent"}
	first, err := svc.Spend(ctx, granted)
	require.NoError(t, err)
	require.True(t, first.OK)
	refusal, err := svc.Spend(ctx, refused)
	require.NoError(t, err)
	require.False(t, refusal.OK)
	_, err = svc.Deny(ctx, "org-a", refusal.ApprovalID, "human", "no")
	require.NoError(t, err)
	age := func(keys, resolved time.Duration) {
		_, err := db.Exec(ctx, `UPDATE mandate_spends SET created_at = now() - $1::interval`, keys)
		require.NoError(t, err)
		_, err = db.Exec(ctx, `UPDATE mandate_approvals SET resolved_at = now() - $1::interval`, resolved)
		require.NoError(t, err)
	}
	p := newPurger(t, db, Config{})

	age(day-time.Hour, old)
	_, err = p.Pass(ctx)
	require.NoError(t, err)

	again, err := svc.Spend(ctx, granted)
	require.NoError(t, err)
	require.True(t, again.Replayed && again.OK)
	again, err = svc.Spend(ctx, refused)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, refusal.ApprovalID, again.ApprovalID, "the refusal's request is still there to answer with")
	got, err := svc.Get(ctx, "org-a", mandates.AnyAgent, m.ID)
	require.NoError(t, err)
	require.EqualValues(t, 4, got.Spent, "debited once")

	age(day+time.Hour, old)
	_, err = p.Pass(ctx)
	require.NoError(t, err)

	require.Zero(t, count(t, db, "mandate_spends", "true"))
	require.Zero(t, count(t, db, "mandate_approvals", "true"))
	fresh, err := svc.Spend(ctx, granted)
	require.NoError(t, err)
	require.False(t, fresh.Replayed, "past its window the key decides afresh")
}

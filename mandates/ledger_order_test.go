package mandates

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A debit's ledger id is made before its spend waits for the mandate's
// row: one that waited (replica 1's batch held up on another mandate of
// the batch, while replica 2 debited) commits after a newer entry. The
// ledger is in commit order, so a reader that paged to the end and keeps
// its cursor sees that debit next, and the entries it read sum to spent.
func TestALedgerReaderFollowingTheCursorSeesADebitThatCommittedLater(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t)
	r1 := New(pool, Config{Logger: testkit.Logger(t)})
	r2 := New(pool, Config{Logger: testkit.Logger(t)})
	a := mustCreate(t, r1, "org-a", "agent-a", "llm", 100)
	b := mustCreate(t, r1, "org-a", "agent-b", "llm", 100)

	tx := lockMandate(t, pool, a.ID)
	onA := request(SpendParams{OrgID: "org-a", AgentID: "agent-a", Scope: "llm", Cost: 1})
	onB := request(SpendParams{OrgID: "org-a", AgentID: "agent-b", Scope: "llm", Cost: 2, Reason: "minted first, committed second"})
	done := make(chan struct{})
	go func() { defer close(done); r1.batcher.run(context.Background(), []*spendRequest{onA, onB}) }()
	// replica 1's batch waits for A's row, its debit of B minted
	require.Eventually(t, func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
		return waiting > 0
	}, testWait, pollEvery)

	res, err := r2.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-b", Scope: "llm", Cost: 5, Reason: "minted second, committed first"})
	require.NoError(t, err)
	require.True(t, res.OK)

	seen, next, err := r1.Ledger(ctx, "org-a", AnyAgent, b.ID, Page{Limit: 50})
	require.NoError(t, err)
	require.Nil(t, next)
	require.Len(t, seen, 1)
	cursor := seen[0].ID

	require.NoError(t, tx.Rollback(ctx))
	<-done
	require.True(t, (<-onB.reply).res.OK)

	after, _, err := r1.Ledger(ctx, "org-a", AnyAgent, b.ID, Page{Cursor: cursor, Limit: 50})
	require.NoError(t, err)
	require.Len(t, after, 1, "the debit committed since the reader's last page")
	require.Equal(t, "minted first, committed second", after[0].Reason)
	require.Equal(t, mustGet(t, r1, "org-a", b).Spent, seen[0].Amount+after[0].Amount)

	all, _, err := r1.Ledger(ctx, "org-a", AnyAgent, b.ID, Page{Limit: 50})
	require.NoError(t, err)
	require.Equal(t, []string{"minted second, committed first", "minted first, committed second"},
		[]string{all[0].Reason, all[1].Reason}, "oldest first: in the order the entries committed")
}

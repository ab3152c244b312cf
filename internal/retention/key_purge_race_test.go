package retention

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

// beforeQuery runs hook (once) before the first query whose SQL holds marker.
type beforeQuery struct {
	marker string
	hook   func()
	done   atomic.Bool
}

func (b *beforeQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, b.marker) && b.done.CompareAndSwap(false, true) {
		b.hook()
	}
	return ctx
}

func (b *beforeQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// purgeUnderQuery gives a purger and a pool on one fresh database, the
// pool's connections traced by trace: its hook runs (once) before the
// first query holding marker.
func purgeUnderQuery(t *testing.T, marker string) (p *Purger, plain, traced *pgxpool.Pool, trace *beforeQuery) {
	t.Helper()
	dsn := testkit.NewDatabase(t)
	plain, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	trace = &beforeQuery{marker: marker}
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = trace
	traced, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	return newPurger(t, plain, Config{}), plain, traced, trace
}

// A spend whose key is just past its window arrives as the purge runs: its
// decision finds the key (still there), the purge then deletes it, and the
// spend's second read of the first answer finds nothing. Past its window
// the key decides afresh (TestASpendKeyInsideItsWindowStillReplaysAfterAPass);
// here the spend fails (a 500 through the API) instead.
func TestASpendWhoseExpiredKeyIsPurgedBetweenItsDecisionAndItsAnswerDecidesAfresh(t *testing.T) {
	ctx := context.Background()
	p, plain, traced, trace := purgeUnderQuery(t, "FROM mandate_spends s")

	svc := mandates.New(traced, mandates.Config{Logger: testkit.Logger(t)})
	_, err := svc.Create(ctx, "org-a", mandates.CreateParams{AgentID: "a1", Scope: "llm", Budget: 10})
	require.NoError(t, err)
	spend := mandates.SpendParams{OrgID: "org-a", AgentID: "a1", Scope: "llm", Cost: 4, IdempotencyKey: "k"}
	first, err := svc.Spend(ctx, spend)
	require.NoError(t, err)
	require.True(t, first.OK)
	_, err = plain.Exec(ctx, `UPDATE mandate_spends SET created_at = now() - interval '25 hours'`)
	require.NoError(t, err)

	trace.hook = func() { // the purge's pass, between the spend's two statements
		n, err := p.Pass(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n["mandate_spends"])
	}
	again, err := svc.Spend(ctx, spend)

	require.True(t, trace.done.Load(), "the purge ran between the decision and the answer")
	require.NoError(t, err, "a key past its window decides afresh, purged or not")
	require.True(t, again.OK)
}

// The same race on a tool call's key: a repeat of a key whose decided call
// is past its retention finds the call in its insert, the purge deletes it,
// and the repeat's read of the key's call finds nothing: an error (a 500)
// instead of a call decided afresh.
func TestAToolCallWhoseExpiredKeyIsPurgedUnderItsRepeatIsDecidedAfresh(t *testing.T) {
	ctx := context.Background()
	p, plain, traced, trace := purgeUnderQuery(t, "SELECT id FROM tool_approvals WHERE org_id = $1 AND agent_id = $2 AND idempotency_key = $3")

	svc := approvals.New(traced, approvals.Config{Logger: testkit.Logger(t)})
	_, err := svc.PutPolicy(ctx, "org-a", approvals.PolicyParams{AgentID: "a1", ToolName: "rm", Approval: "never", UpdatedBy: "op"})
	require.NoError(t, err)
	req := approvals.RequestParams{OrgID: "org-a", SessionID: "s1", AgentID: "a1", ToolName: "rm", IdempotencyKey: "k", RequestedBy: "agent"}
	first, err := svc.Request(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "denied", first.Decision)
	_, err = plain.Exec(ctx, `UPDATE tool_approvals SET created_at = now() - interval '8 days', resolved_at = now() - interval '8 days'`)
	require.NoError(t, err)

	trace.hook = func() {
		n, err := p.Pass(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n["tool_approvals"])
	}
	again, err := svc.Request(ctx, req)

	require.True(t, trace.done.Load(), "the purge ran between the insert and the key's read")
	require.NoError(t, err, "a key past its retention is decided afresh, purged or not")
	require.NotEqual(t, first.Approval.ID, again.Approval.ID)
}

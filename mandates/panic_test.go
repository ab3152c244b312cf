package mandates

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

// panicOnSpendRead panics while a spend's result is read, once armed: a
// bug there, which a test cannot cause otherwise (a tracer stands in).
type panicOnSpendRead struct{ armed atomic.Bool }

func (*panicOnSpendRead) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*panicOnSpendRead) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (*panicOnSpendRead) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (t *panicOnSpendRead) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "WITH claim AS") && t.armed.CompareAndSwap(true, false) { // (once)
		panic("a bug while reading a spend")
	}
}
func (*panicOnSpendRead) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A spend that panics while its result is read gives its connection back,
// in a batch and alone: recovered, the panic no longer ended the process,
// and the connection stayed out of the pool (the service's Close then
// waited for it for good). Found by review.
func TestAPanickingSpendGivesItsConnectionBack(t *testing.T) {
	for _, n := range []int{2, 1} { // 2: a batch; 1: a lone spend (spendAlone)
		t.Run(map[int]string{1: "lone", 2: "batch"}[n], func(t *testing.T) {
			tr := &panicOnSpendRead{}
			pcfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
			require.NoError(t, err)
			pcfg.ConnConfig.Tracer = tr
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			require.NoError(t, err)
			defer func() { // (Close waits for a leaked connection for good)
				if pool.Stat().AcquiredConns() == 0 {
					pool.Close()
				}
			}()
			s := New(pool, Config{Logger: testkit.Logger(t)}) // no inbox
			mustCreate(t, s, "org-a", "a1", "llm", 10)
			mustCreate(t, s, "org-a", "a2", "llm", 10)
			reqs := []*spendRequest{request(SpendParams{OrgID: "org-a", AgentID: "a1", Scope: "llm", Cost: 1})}
			if n == 2 {
				reqs = append(reqs, request(SpendParams{OrgID: "org-a", AgentID: "a2", Scope: "llm", Cost: 1}))
			}
			tr.armed.Store(true)
			require.NotPanics(t, func() { s.batcher.run(context.Background(), reqs) })
			tr.armed.Store(false)
			for _, r := range reqs {
				require.Error(t, (<-r.reply).err)
			}
			require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 3*time.Second, 10*time.Millisecond,
				"the panicked spend's connection stayed out of the pool: %d acquired", pool.Stat().AcquiredConns())
		})
	}
}

// A batch that fails with a server error is retried spend by spend
// (retryAlone); a panic in one of those (the inbox hook's bug on agent
// "b-faulty"'s refusal) answered every spend after it with "its batch
// failed", though none of them was tried, and nothing of theirs committed.
func TestAPanicInARetriedSpendFailsOnlyItsOwnSpend(t *testing.T) {
	pool := testkit.NewPool(t)
	events := inbox.New(pool, inbox.Config{Logger: testkit.Logger(t)})
	events.OnAppend = func(_ context.Context, _ db.Querier, ev inbox.Event) error {
		if strings.Contains(string(ev.Approval), `"b-faulty"`) {
			panic("a hook's bug")
		}
		return nil
	}
	s := New(pool, Config{Logger: testkit.Logger(t), Inbox: events})
	for _, a := range []string{"a-13", "b-faulty", "c-fine"} {
		mustCreate(t, s, "org-a", a, "llm", 20)
	}
	failOnCost13(t, pool) // a server error: the batch is rolled back and retried alone
	reqs := []*spendRequest{
		request(SpendParams{OrgID: "org-a", AgentID: "a-13", Scope: "llm", Cost: 13}),
		request(SpendParams{OrgID: "org-a", AgentID: "b-faulty", Scope: "llm", Cost: 50}), // refused: the hook runs
		request(SpendParams{OrgID: "org-a", AgentID: "c-fine", Scope: "llm", Cost: 1}),
	}
	require.NotPanics(t, func() { s.batcher.run(context.Background(), reqs) })
	fine := <-reqs[2].reply
	require.True(t, fine.alone || (fine.err == nil && fine.res.OK),
		"c-fine was never tried, and failed: %+v", fine)
}

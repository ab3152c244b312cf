package mandates

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failOnCost13 makes any debit of 13 fail at its ledger insert, so that a
// test can put a failing statement into a batch.
func failOnCost13(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `ALTER TABLE mandate_ledger ADD CONSTRAINT test_not_13 CHECK (amount <> 13)`)
	require.NoError(t, err)
}

func request(p SpendParams) *spendRequest {
	return &spendRequest{p: p, ctx: context.Background(), reply: make(chan spendReply, 1)}
}

// A failing statement rolls its batch back whole; every other spend of the
// batch is then decided on its own and only the failing one errs.
func TestAFailedStatementInABatchLeavesTheOtherSpendsToBeDecidedAlone(t *testing.T) {
	s, db := newTestService(t)
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	failOnCost13(t, db)
	good := func(key string) *spendRequest {
		return request(SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, IdempotencyKey: key})
	}
	bad := request(SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 13, IdempotencyKey: "bad"})
	batch := []*spendRequest{good("a"), bad, good("b"), good("c")}
	s.batcher.run(context.Background(), batch)

	for _, r := range batch {
		got := <-r.reply
		if r == bad {
			var pgErr *pgconn.PgError
			require.ErrorAs(t, got.err, &pgErr)
			require.Equal(t, "23514", pgErr.Code)
			continue
		}
		require.NoError(t, got.err)
		require.True(t, got.res.OK)
		require.True(t, got.decided, "decided once, by the retry")
	}
	require.EqualValues(t, 3, mustGet(t, s, "org-a", m).Spent)
	requireLedgerMatches(t, db)
}

// A batch decides exactly what the same spends decide one after another,
// including a key repeated inside the batch.
func TestABatchDecidesLikeTheSameSpendsInSequence(t *testing.T) {
	s, db := newTestService(t)
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 3)
	spend := func(agent string, cost int64, key string) *spendRequest {
		return request(SpendParams{OrgID: "org-a", AgentID: agent, Scope: "llm", Cost: cost, IdempotencyKey: key})
	}
	k1, k1Again, k2, k3, k1Other, noMandate := spend("agent-1", 2, "k1"), spend("agent-1", 2, "k1"),
		spend("agent-1", 1, "k2"), spend("agent-1", 1, "k3"), spend("agent-1", 5, "k1"), spend("agent-2", 1, "")
	s.batcher.run(context.Background(), []*spendRequest{noMandate, k1, k1Again, k2, k3, k1Other})
	reply := func(r *spendRequest) spendReply { return <-r.reply }
	first, again := reply(k1), reply(k1Again)
	require.NoError(t, first.err)
	require.NoError(t, again.err)
	require.True(t, first.res.OK)
	require.True(t, first.decided)
	require.False(t, again.decided, "the repeated key is replayed")
	require.Equal(t, first.res.MandateID, again.res.MandateID)
	r2 := reply(k2)
	require.True(t, r2.res.OK, "k2 fits: 2 + 1 ≤ 3")
	require.EqualValues(t, 0, r2.res.Remaining)
	require.False(t, reply(k3).res.OK, "k3 does not")
	require.ErrorIs(t, reply(k1Other).err, ErrIdempotencyKeyReused)
	nm := reply(noMandate)
	require.False(t, nm.res.OK)
	require.Equal(t, RefusalNoMandate, nm.res.Refusal)
	require.EqualValues(t, 3, mustGet(t, s, "org-a", m).Spent)
	require.Equal(t, 2, countApprovals(t, db, "org-a", StatePending))
	requireLedgerMatches(t, db)
}

// Many concurrent spends, one of which fails: the batcher shares commits,
// every other spend is decided, the budget holds.
func TestConcurrentSpendsShareCommitsAndAFailingOneHurtsNoOther(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, db := newTestService(t, Config{Registry: reg})
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 50)
	mustCreate(t, s, "org-a", "agent-2", "llm", 100)
	failOnCost13(t, db)
	const n = 80
	errs := make([]error, n)
	results := make([]SpendResult, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			p := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, IdempotencyKey: fmt.Sprint(i)}
			if i == n/2 {
				p.AgentID, p.Cost = "agent-2", 13 // always debited, so always failing
			}
			results[i], errs[i] = s.Spend(ctx, p)
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i := range n {
		if i == n/2 {
			require.Error(t, errs[i])
			continue
		}
		require.NoError(t, errs[i])
		if results[i].OK {
			ok++
		}
	}
	require.Equal(t, 50, ok)
	require.EqualValues(t, 50, mustGet(t, s, "org-a", m).Spent)
	requireLedgerMatches(t, db)
	count, sum := histogram(t, reg, "reveille_mandates_spend_batch_size")
	require.EqualValues(t, n, sum, "every spend went through a batch once")
	require.Positive(t, count)
}

func TestWithBatchingOffEverySpendCommitsAlone(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, db := newTestService(t, Config{MaxSpendBatch: 1, Registry: reg})
	require.Nil(t, s.batcher)
	ctx := context.Background()
	mustCreate(t, s, "org-a", "agent-1", "llm", 20)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, 12, countApprovals(t, db, "org-a", StatePending))
	requireLedgerMatches(t, db)
	count, _ := histogram(t, reg, "reveille_mandates_spend_batch_size")
	require.Zero(t, count)
}

func histogram(t *testing.T, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

// A batch never takes a mandate another running batch holds; that
// mandate's spends wait and then go together.
func TestABatchLeavesTheSpendsOfAMandateInFlightForTheNextOne(t *testing.T) {
	b := newSpendBatcher(nil, 3, 4)
	spend := func(agent string) *spendRequest {
		return request(SpendParams{OrgID: "org-a", AgentID: agent, Scope: "llm", Cost: 1})
	}
	a1, b1, a2, c1, d1, e1 := spend("a"), spend("b"), spend("a"), spend("c"), spend("d"), spend("e")
	b.pending = []*spendRequest{a1, b1, a2, c1, d1, e1}
	b.inFlight[keyOf(a1.p)] = true

	batch, keys := b.take()
	require.Equal(t, []*spendRequest{b1, c1, d1}, batch, "a is held; at most three")
	require.Len(t, keys, 3)
	require.Equal(t, []*spendRequest{a1, a2, e1}, b.pending)

	delete(b.inFlight, keyOf(a1.p))
	batch, _ = b.take()
	require.Equal(t, []*spendRequest{a1, a2, e1}, batch, "both of a's spends go together")
	require.Empty(t, b.pending)
	batch, _ = b.take()
	require.Empty(t, batch)
}

// A spend whose caller gave up while it waited behind a batch of its
// mandate is answered with its context's error and not decided: a caller
// told that its spend failed is not debited for it.
func TestASpendWhoseCallerLeftBeforeItsBatchBeganIsNotDebited(t *testing.T) {
	s, db := newTestService(t)
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	ctx := context.Background()
	// the first spend's batch waits for the mandate's row
	tx := lockMandate(t, db, m.ID)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
		assert.NoError(t, err)
	})
	b := s.batcher
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.inFlight) == 1 && len(b.pending) == 0
	}, testWait, pollEvery, "the first spend's batch runs")

	left, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := s.Spend(left, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 10})
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller is told its spend failed")

	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.running == 0 && len(b.pending) == 0
	}, testWait, pollEvery, "every spend taken")
	require.EqualValues(t, 1, mustGet(t, s, "org-a", m).Spent, "the 10 of the caller that left is not debited")
}

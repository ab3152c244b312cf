package mandates

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
)

// An approval event's hook that joins the transaction it is handed (an
// approval webhook's enqueue) joins the batch's: given the bare connection
// it began and committed a transaction of its own, which committed the
// batch half done; a later failure then sent every spend through again
// alone, debiting the granted one twice and leaving the failed one's
// approval request behind.
func TestAnApprovalEventsHookWritesInTheBatchsTransaction(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t)
	events := inbox.New(pool, inbox.Config{Logger: testkit.Logger(t)})
	events.OnAppend = func(ctx context.Context, q db.Querier, ev inbox.Event) error {
		return db.InTx(ctx, q, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO test_hooked (seq) VALUES ($1)`, ev.Seq)
			return err
		})
	}
	s := New(pool, Config{Logger: testkit.Logger(t), Inbox: events})
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	// A fault valid input cannot cause: the event of agent "faulty"'s
	// refusal fails, after the refused spend's event and its hook ran.
	_, err := pool.Exec(ctx, `
		CREATE TABLE test_hooked (seq bigint);
		CREATE FUNCTION refuse_faulty() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.payload->>'agent_id' = 'faulty' THEN RAISE EXCEPTION 'faulty event'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_faulty BEFORE INSERT ON approval_events FOR EACH ROW EXECUTE FUNCTION refuse_faulty();`)
	require.NoError(t, err)
	granted := request(SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	refused := request(SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1000})
	faulty := request(SpendParams{OrgID: "org-a", AgentID: "faulty", Scope: "llm", Cost: 1})

	s.batcher.run(context.Background(), []*spendRequest{granted, refused, faulty})

	g, r, f := <-granted.reply, <-refused.reply, <-faulty.reply
	require.NoError(t, g.err)
	require.True(t, g.res.OK)
	require.NoError(t, r.err)
	require.False(t, r.res.OK)
	require.ErrorContains(t, f.err, "faulty event")
	require.EqualValues(t, 1, mustGet(t, s, "org-a", m).Spent, "the granted spend was debited once")
	require.Equal(t, 1, countApprovals(t, pool, "org-a", StatePending), "one approval request: the refused spend's")
	var hooked int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM test_hooked`).Scan(&hooked))
	require.Equal(t, 1, hooked, "its event's hook ran once, in the transaction that committed it")
	requireLedgerMatches(t, pool)
}

// A batch's refusals append their approvals inbox events in two round
// trips however many they are (their requests read, then the appends,
// pipelined): appended one after another they cost two each, while the
// batch's transaction held its mandates and the org's event counter.
func TestABatchOfRefusalsAppendsItsEventsInTwoRoundTrips(t *testing.T) {
	ctx := context.Background()
	rt := &testkit.RoundTrips{}
	cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	events := inbox.New(pool, inbox.Config{Logger: testkit.Logger(t)})
	s := New(pool, Config{Logger: testkit.Logger(t), Inbox: events})
	mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	batch := func(n int) []*spendRequest {
		reqs := make([]*spendRequest, n)
		for i := range reqs {
			reqs[i] = request(SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1000})
		}
		s.batcher.run(context.Background(), reqs)
		for _, r := range reqs {
			got := <-r.reply
			require.NoError(t, got.err)
			require.False(t, got.res.OK)
		}
		return reqs
	}
	batch(1) // warm-up: statements prepared
	rt.Take()

	batch(5)

	trips := rt.Take()
	require.Len(t, trips, 4, "the decisions (after BEGIN), the requests read, the appends, COMMIT:\n%s", strings.Join(trips, "\n"))
	require.Equal(t, 6, countApprovals(t, pool, "org-a", StatePending))
	var appended int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM approval_events WHERE org_id = 'org-a'`).Scan(&appended))
	require.Equal(t, 6, appended, "one event a refusal")
}

// A panic in a spend batch (a bug; here an inbox hook that panics on agent
// "faulty"'s refusal) before anything of it committed sends its spends
// alone, each in its caller's goroutine: the others are decided, and the
// faulty one fails on its own (a 500), not the batcher's goroutine, which
// serves every org and whose panic ended the process.
func TestAPanicInASpendBatchBeforeItsCommitSendsItsSpendsAlone(t *testing.T) {
	ctx := context.Background()
	pool := testkit.NewPool(t)
	events := inbox.New(pool, inbox.Config{Logger: testkit.Logger(t)})
	events.OnAppend = func(_ context.Context, _ db.Querier, ev inbox.Event) error {
		if strings.Contains(string(ev.Approval), `"faulty"`) {
			panic("a hook's bug")
		}
		return nil
	}
	s := New(pool, Config{Logger: testkit.Logger(t), Inbox: events})
	mustCreate(t, s, "org-a", "faulty", "llm", 10)
	mustCreate(t, s, "org-a", "fine", "llm", 10)
	faulty := SpendParams{OrgID: "org-a", AgentID: "faulty", Scope: "llm", Cost: 50} // refused: its event runs the hook
	fine := SpendParams{OrgID: "org-a", AgentID: "fine", Scope: "llm", Cost: 1}
	reqs := []*spendRequest{request(faulty), request(fine)}

	require.NotPanics(t, func() { s.batcher.run(context.Background(), reqs) })
	for _, r := range reqs {
		require.True(t, (<-r.reply).alone, "nothing committed: %s goes alone", r.p.AgentID)
	}
	var spent int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(spent), 0) FROM mandates WHERE org_id = 'org-a'`).Scan(&spent))
	require.Zero(t, spent, "the batch rolled back")

	// Through Spend the batcher lives on: the faulty spend fails (alone in
	// its batch, no telling whether it committed), the next is served.
	_, err := s.Spend(ctx, faulty)
	require.ErrorContains(t, err, "spend: its batch failed: a hook's bug")
	res, err := s.Spend(ctx, fine)
	require.NoError(t, err)
	require.True(t, res.OK)
}

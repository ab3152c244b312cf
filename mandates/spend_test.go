package mandates

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

func TestSixtyFourConcurrentSpendersNeverOverspendABudgetOfTwenty(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 20)

	const n = 64
	results := make([]SpendResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, Reason: "call"})
		})
	}
	close(start)
	wg.Wait()

	ok, refused := 0, 0
	approvals := map[uuid.UUID]bool{}
	for i := range n {
		require.NoError(t, errs[i])
		if results[i].OK {
			ok++
			require.Equal(t, m.ID, results[i].MandateID)
		} else {
			refused++
			require.NotEqual(t, uuid.Nil, results[i].ApprovalID)
			require.Equal(t, RefusalInsufficient, results[i].Refusal)
			approvals[results[i].ApprovalID] = true
		}
	}
	require.Equal(t, 20, ok)
	require.Equal(t, 44, refused)
	require.Len(t, approvals, 44, "every refusal has its own approval request")
	require.Equal(t, 44, countApprovals(t, db, "org-a", StatePending))
	got := mustGet(t, s, "org-a", m)
	require.EqualValues(t, 20, got.Spent)
	require.EqualValues(t, 0, got.Remaining())
	requireLedgerMatches(t, db)
}

func TestSpendReportsWhatRemains(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 4})
	require.NoError(t, err)
	require.True(t, r.OK)
	require.EqualValues(t, 6, r.Remaining)
	r, err = s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 6})
	require.NoError(t, err)
	require.True(t, r.OK)
	require.EqualValues(t, 0, r.Remaining)
}

func TestACostOfZeroPassesEvenWithNothingLeft(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 0)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 0})
	require.NoError(t, err)
	require.True(t, r.OK)
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent)
	requireLedgerMatches(t, db)
}

// Past an approved overrun (spent above budget) a spend of 0 still passes,
// as at spent = budget, and asks no human: what is left is 0, not less.
// It was refused as insufficient, with an approval request for nothing.
func TestACostOfZeroPassesAfterAnApprovedOverrun(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 5)
	over, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 8, RequestedBy: "alice"})
	require.NoError(t, err)
	require.False(t, over.OK)
	_, err = s.Approve(ctx, "org-a", over.ApprovalID, "bob", "")
	require.NoError(t, err)
	require.EqualValues(t, 8, mustGet(t, s, "org-a", m).Spent)

	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 0, RequestedBy: "alice"})
	require.NoError(t, err)
	require.True(t, r.OK, "refused as %q", r.Refusal)
	require.EqualValues(t, 0, r.Remaining)
	require.Zero(t, countApprovals(t, db, "org-a", StatePending), "no approval request for a spend of nothing")
	r, err = s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, RequestedBy: "alice"})
	require.NoError(t, err)
	require.False(t, r.OK, "a spend of 1 is still refused")
	requireLedgerMatches(t, db)
}

func TestSpendRejectsBadInputNamingTheField(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	long := strings.Repeat("x", 1001)
	for _, tc := range []struct {
		field string
		p     SpendParams
	}{
		{"cost", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: -1}},
		{"agent_id", SpendParams{OrgID: "org-a", Scope: "s", Cost: 1}},
		{"agent_id", SpendParams{OrgID: "org-a", AgentID: long, Scope: "s", Cost: 1}},
		{"scope", SpendParams{OrgID: "org-a", AgentID: "a", Cost: 1}},
		{"scope", SpendParams{OrgID: "org-a", AgentID: "a", Scope: long, Cost: 1}},
		{"on_resolve.kind", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, OnResolve: &Payload{}}},
		{"reason", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, Reason: "nul\x00byte"}},
		{"reason", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, Reason: long}},
		{"idempotency_key", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, IdempotencyKey: "\xff"}},
		{"idempotency_key", SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, IdempotencyKey: long}},
	} {
		_, err := s.Spend(ctx, tc.p)
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, tc.field)
		require.Equal(t, tc.field, inv.Fields[0].Field)
	}
	require.Zero(t, countApprovals(t, db, "org-a", StatePending), "nothing is written for bad input")
	// (1,000 bytes is still text enough: refused for want of a mandate)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "a", Scope: "s", Cost: 1, Reason: long[:1000]})
	require.NoError(t, err)
	require.Equal(t, RefusalNoMandate, r.Refusal)
}

func TestACostBeyondTwoToTheFiftyThreeIsRefusedAsInvalid(t *testing.T) {
	s, _ := newTestService(t)
	mustCreate(t, s, "org-a", "agent-1", "llm", MaxAmount)
	_, err := s.Spend(context.Background(), SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: MaxAmount + 1})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "cost", inv.Fields[0].Field)
	r, err := s.Spend(context.Background(), SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: MaxAmount})
	require.NoError(t, err)
	require.True(t, r.OK)
}

func TestAbsentRevokedAndExpiredMandatesRefuseWithAnApprovalRequest(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	revoked := mustCreate(t, s, "org-a", "agent-1", "revoked", 100)
	_, err := s.Patch(ctx, "org-a", AnyAgent, revoked.ID, PatchParams{Status: ptr(StatusRevoked)})
	require.NoError(t, err)
	past := time.Now().Add(-time.Hour)
	_, err = s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "expired", Budget: 100, ValidUntil: &past})
	require.NoError(t, err)
	mustCreate(t, s, "org-b", "agent-1", "other-org", 100)

	for scope, why := range map[string]string{
		"absent": RefusalNoMandate, "revoked": RefusalRevoked, "expired": RefusalExpired,
		"other-org": RefusalNoMandate, // org-b's mandate is not org-a's
	} {
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: scope, Cost: 1, Reason: "r"})
		require.NoError(t, err)
		require.False(t, r.OK, scope)
		require.Equal(t, why, r.Refusal, scope)
		a, err := s.GetApproval(ctx, "org-a", AnyAgent, r.ApprovalID)
		require.NoError(t, err)
		require.Equal(t, StatePending, a.State)
		require.Equal(t, scope, a.Scope)
	}
	require.Equal(t, 4, countApprovals(t, db, "org-a", StatePending))
	requireLedgerMatches(t, db)
}

// A spend that waited for a revoke or a budget cut to commit is refused
// for what it waited for, and its approval request shows the mandate as
// it refused: read from the statement's snapshot, the refusal was
// "insufficient", with the budget from before the change.
func TestASpendThatWaitedForAChangeIsRefusedForIt(t *testing.T) {
	for _, tc := range []struct {
		name, change, why string
		budget, remaining int64
	}{
		{"a revoke", `UPDATE mandates SET status = 'revoked', updated_at = now() WHERE id = $1`, RefusalRevoked, 10, 10},
		{"a budget cut", `UPDATE mandates SET budget = 2, updated_at = now() WHERE id = $1`, RefusalInsufficient, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, db := newTestService(t, Config{MaxSpendBatch: 1})
			ctx := context.Background()
			m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, tc.change, m.ID)
			require.NoError(t, err)
			answer := spendBehindLock(t, s, db, "the change")
			require.NoError(t, tx.Commit(ctx))
			got, err := answer()
			require.NoError(t, err)
			require.False(t, got.OK)
			require.Equal(t, tc.why, got.Refusal)
			require.Equal(t, tc.remaining, got.Remaining)
			a, err := s.GetApproval(ctx, "org-a", AnyAgent, got.ApprovalID)
			require.NoError(t, err)
			require.Equal(t, tc.why, a.Refusal)
			require.NotNil(t, a.Budget)
			require.Equal(t, tc.budget, *a.Budget, "the request shows the mandate that refused")
			requireLedgerMatches(t, db)
		})
	}
}

func TestAFutureValidUntilStillSpends(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	future := time.Now().Add(time.Hour)
	_, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 5, ValidUntil: &future})
	require.NoError(t, err)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5})
	require.NoError(t, err)
	require.True(t, r.OK)
}

func TestABudgetRaisedByPatchLetsTheNextSpendPass(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 1)
	spend := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 3}
	r, err := s.Spend(ctx, spend)
	require.NoError(t, err)
	require.False(t, r.OK)
	require.Equal(t, RefusalInsufficient, r.Refusal)
	require.EqualValues(t, 1, r.Remaining)

	_, err = s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Budget: ptr[int64](3)})
	require.NoError(t, err)
	r, err = s.Spend(ctx, spend)
	require.NoError(t, err)
	require.True(t, r.OK)
	require.EqualValues(t, 0, r.Remaining)
}

func TestRevivingARevokedMandateLetsItSpendAgain(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 5)
	_, err := s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Status: ptr(StatusRevoked)})
	require.NoError(t, err)
	_, err = s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Status: ptr(StatusActive), SetValidUntil: true})
	require.NoError(t, err)
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5})
	require.NoError(t, err)
	require.True(t, r.OK)
}

// The wake-up pattern: the refusal and the caller's intent commit together in
// the first transaction, and a failure of the caller's second transaction
// cannot take them back.
func TestARefusedSpendTxStaysCommittedWhenItsCallerFailsAfterwards(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	_, err := db.Exec(ctx, `CREATE TABLE intents (id uuid PRIMARY KEY, approval_id uuid, state text)`)
	require.NoError(t, err)

	intent := uuid.New()
	var res SpendResult
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		res, _, err = s.SpendTx(ctx, tx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5, Reason: "wake",
			OnResolve: &Payload{Kind: "wakeup", Data: []byte(`{"wakeup_id":"` + intent.String() + `"}`)}})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO intents VALUES ($1, $2, 'awaiting_approval')`, intent, res.ApprovalID)
		return err
	})
	require.NoError(t, err)
	require.False(t, res.OK)

	callerFailed := errors.New("enqueue failed")
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE intents SET state = 'enqueued' WHERE id = $1`, intent); err != nil {
			return err
		}
		return callerFailed
	})
	require.ErrorIs(t, err, callerFailed)

	a, err := s.GetApproval(ctx, "org-a", AnyAgent, res.ApprovalID)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.Equal(t, "wakeup", a.OnResolve.Kind)
	require.JSONEq(t, `{"wakeup_id":"`+intent.String()+`"}`, string(a.OnResolve.Data))
	var state string
	require.NoError(t, db.QueryRow(ctx, `SELECT state FROM intents WHERE approval_id = $1`, res.ApprovalID).Scan(&state))
	require.Equal(t, "awaiting_approval", state)
}

// Spend commits on its own: the caller's later rollback does not reach it.
func TestASpendsRefusalSurvivesTheCallersRollback(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	res, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.False(t, res.OK)
	_, err = s.GetApproval(ctx, "org-a", AnyAgent, res.ApprovalID)
	require.NoError(t, err)
}

// SpendTx is atomic with the caller: a rolled-back transaction debits
// nothing and leaves no request.
func TestASpendTxRolledBackByItsCallerLeavesNothing(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 1)
	for _, cost := range []int64{1, 5} {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		_, _, err = s.SpendTx(ctx, tx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: cost, IdempotencyKey: "k"})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
	}
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent)
	require.Zero(t, countApprovals(t, db, "org-a", StatePending))
	requireLedgerMatches(t, db)

	// The key was never committed, so it decides afresh.
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, IdempotencyKey: "k"})
	require.NoError(t, err)
	require.True(t, r.OK)
	require.False(t, r.Replayed)
}

func TestARepeatedKeyReturnsTheFirstAnswerAndDebitsOnce(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 3)
	p := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 2, IdempotencyKey: "k1"}
	first, err := s.Spend(ctx, p)
	require.NoError(t, err)
	require.True(t, first.OK)
	again, err := s.Spend(ctx, p)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	again.Replayed = false
	require.Equal(t, first, again)
	require.EqualValues(t, 2, mustGet(t, s, "org-a", m).Spent)

	t.Run("a refusal is replayed with its one approval request", func(t *testing.T) {
		p := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 2, IdempotencyKey: "k2"}
		first, err := s.Spend(ctx, p)
		require.NoError(t, err)
		require.False(t, first.OK)
		// Even once the budget would allow it, the key keeps its answer.
		_, err = s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Budget: ptr[int64](100)})
		require.NoError(t, err)
		again, err := s.Spend(ctx, p)
		require.NoError(t, err)
		require.False(t, again.OK)
		require.Equal(t, first.ApprovalID, again.ApprovalID)
		require.Equal(t, 1, countApprovals(t, db, "org-a", StatePending))
	})
	t.Run("the same key in another org is its own", func(t *testing.T) {
		mustCreate(t, s, "org-b", "agent-1", "llm", 3)
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-b", AgentID: "agent-1", Scope: "llm", Cost: 2, IdempotencyKey: "k1"})
		require.NoError(t, err)
		require.True(t, r.OK)
		require.False(t, r.Replayed)
	})
	// (k1 was granted, k2 refused: each keeps its reason in its own row)
	for _, tc := range []struct {
		name string
		p    SpendParams
	}{
		{"another cost", SpendParams{Scope: "llm", Cost: 1, IdempotencyKey: "k1"}},
		{"another scope", SpendParams{Scope: "tools", Cost: 2, IdempotencyKey: "k1"}},
		{"another reason for a granted spend", SpendParams{Scope: "llm", Cost: 2, Reason: "other", IdempotencyKey: "k1"}},
		{"another reason for a refused spend", SpendParams{Scope: "llm", Cost: 2, Reason: "other", IdempotencyKey: "k2"}},
	} {
		t.Run("the key with "+tc.name+" is a conflict", func(t *testing.T) {
			tc.p.OrgID, tc.p.AgentID = "org-a", "agent-1"
			_, err := s.Spend(ctx, tc.p)
			require.ErrorIs(t, err, ErrIdempotencyKeyReused)
			require.ErrorIs(t, err, apperr.ErrConflict)
			require.EqualValues(t, 2, mustGet(t, s, "org-a", m).Spent)
			require.Equal(t, 1, countApprovals(t, db, "org-a", StatePending))
		})
	}
	requireLedgerMatches(t, db)
}

func TestConcurrentSpendsWithOneKeyDebitOnceAndAgree(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	for _, tc := range []struct {
		name string
		cost int64
		ok   bool
	}{{"granted", 7, true}, {"refused", 1000, false}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 32
			results := make([]SpendResult, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], errs[i] = s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm",
						Cost: tc.cost, IdempotencyKey: "same-" + tc.name})
				})
			}
			close(start)
			wg.Wait()
			fresh := 0
			for i := range n {
				require.NoError(t, errs[i])
				if !results[i].Replayed {
					fresh++
				}
				r := results[i]
				r.Replayed = false
				first := results[0]
				first.Replayed = false
				require.Equal(t, first, r)
				require.Equal(t, tc.ok, r.OK)
			}
			require.Equal(t, 1, fresh, "exactly one call decided")
		})
	}
	require.EqualValues(t, 7, mustGet(t, s, "org-a", m).Spent)
	require.Equal(t, 1, countApprovals(t, db, "org-a", StatePending))
	requireLedgerMatches(t, db)
}

// A duplicate of a key held by an open SpendTx waits for it, then replays
// its answer.
func TestADuplicateKeyWaitsForTheOpenTransactionThatHoldsIt(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	p := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 4, IdempotencyKey: "held"}

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	first, _, err := s.SpendTx(ctx, tx, p)
	require.NoError(t, err)
	require.True(t, first.OK)

	type answer struct {
		r   SpendResult
		err error
	}
	dup := make(chan answer, 1)
	go func() {
		r, err := s.Spend(ctx, p)
		dup <- answer{r, err}
	}()
	require.Eventually(t, func() bool { return lockWaiters(t, db) > 0 }, testWait, pollEvery, "the duplicate waits on the key")
	require.NoError(t, tx.Commit(ctx))
	got := <-dup
	require.NoError(t, got.err)
	require.True(t, got.r.Replayed)
	require.Equal(t, first.MandateID, got.r.MandateID)
	require.EqualValues(t, 4, mustGet(t, s, "org-a", m).Spent)
}

func lockWaiters(t *testing.T, db *pgxpool.Pool) int {
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
	return n
}

// Spends, refunds and approvals race; after every step of every worker the
// ledger still sums to spent, and spent never passes the budget except by
// approved overruns.
func TestTheLedgerSumsToSpentUnderARandomMix(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	scopes := []string{"a", "b", "c"}
	for _, sc := range scopes {
		mustCreate(t, s, "org-a", "agent-1", sc, 15)
	}
	const workers, steps = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for i := range steps {
				if err := randomStep(ctx, s, rng, scopes, fmt.Sprintf("w%d-%d", w, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	type check struct {
		runs, bad int
		err       error
	}
	checked := make(chan check)
	go func() {
		var c check
		for c.err == nil && c.bad == 0 {
			select {
			case <-stop:
				checked <- c
				return
			default:
			}
			c.bad, c.err = invariantViolations(ctx, db)
			c.runs++
		}
		<-stop
		checked <- c
	}()
	wg.Wait()
	close(stop)
	c := <-checked
	require.NoError(t, c.err)
	require.Zero(t, c.bad, "mandates breaking the ledger invariant while the mix ran")
	require.Positive(t, c.runs)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	requireLedgerMatches(t, db)
	requireInvariantInOneSnapshot(t, db)
	var kinds []string
	require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(DISTINCT kind ORDER BY kind) FROM mandate_ledger`).Scan(&kinds))
	require.Equal(t, []string{KindApprovedOverrun, KindDebit, KindRefund}, kinds, "the mix exercised every kind of entry")
}

func randomStep(ctx context.Context, s *Service, rng *rand.Rand, scopes []string, key string) error {
	scope := scopes[rng.IntN(len(scopes))]
	switch rng.IntN(10) {
	case 0, 1: // refund part of what was spent, if anything
		m, err := s.Find(ctx, "org-a", "agent-1", scope)
		if err != nil || m.Spent == 0 {
			return err
		}
		err = s.Refund(ctx, "org-a", "agent-1", scope, rng.Int64N(m.Spent)+1, "refund", key)
		var inv *apperr.InvalidError
		if errors.As(err, &inv) { // a concurrent refund got there first
			return nil
		}
		return err
	case 2: // approve a pending overrun
		items, _, err := s.ListApprovals(ctx, "org-a", ApprovalFilter{State: StatePending}, Page{Limit: 1})
		if err != nil || len(items) == 0 {
			return err
		}
		_, err = s.Approve(ctx, "org-a", items[0].ID, "approver", "")
		if errors.Is(err, ErrAlreadyResolved) {
			return nil
		}
		return err
	default:
		k := ""
		if rng.IntN(2) == 0 {
			k = key
		}
		_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: scope, Cost: rng.Int64N(5), IdempotencyKey: k})
		return err
	}
}

func requireInvariantInOneSnapshot(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	bad, err := invariantViolations(context.Background(), db)
	require.NoError(t, err)
	require.Zero(t, bad, "mandates breaking the ledger invariant")
}

// invariantViolations counts mandates whose spent differs from their ledger
// sum, is negative, or passes the budget by more than approved overruns —
// read in one snapshot.
func invariantViolations(ctx context.Context, db *pgxpool.Pool) (int, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var bad int
	err = tx.QueryRow(ctx, `
		SELECT count(*) FROM mandates m
		 WHERE m.spent <> (SELECT COALESCE(SUM(amount), 0) FROM mandate_ledger l WHERE l.mandate_id = m.id)
		    OR m.spent < 0
		    OR m.spent > m.budget + (SELECT COALESCE(SUM(amount), 0) FROM mandate_ledger l
		                              WHERE l.mandate_id = m.id AND l.kind = 'approved_overrun')`).Scan(&bad)
	return bad, err
}

func TestRefundWritesTheCompensatingRowOncePerKey(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
	_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 6})
	require.NoError(t, err)

	require.NoError(t, s.Refund(ctx, "org-a", "agent-1", "llm", 4, "work never ran", "r1"))
	require.NoError(t, s.Refund(ctx, "org-a", "agent-1", "llm", 4, "work never ran", "r1"))
	require.EqualValues(t, 2, mustGet(t, s, "org-a", m).Spent)
	entries, _, err := s.Ledger(ctx, "org-a", AnyAgent, m.ID, Page{})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, KindRefund, entries[1].Kind)
	require.EqualValues(t, -4, entries[1].Amount)
	require.Equal(t, "r1", entries[1].IdempotencyKey)

	t.Run("more than was spent is refused", func(t *testing.T) {
		var inv *apperr.InvalidError
		require.ErrorAs(t, s.Refund(ctx, "org-a", "agent-1", "llm", 3, "", "r2"), &inv)
		require.Equal(t, "amount", inv.Fields[0].Field)
		require.ErrorAs(t, s.Refund(ctx, "org-a", "agent-1", "llm", -1, "", ""), &inv)
	})
	t.Run("an absent mandate is not found", func(t *testing.T) {
		require.ErrorIs(t, s.Refund(ctx, "org-a", "agent-1", "nope", 1, "", ""), ErrNotFound)
		require.ErrorIs(t, s.Refund(ctx, "org-b", "agent-1", "llm", 1, "", ""), ErrNotFound)
	})
	t.Run("RefundTx commits with the caller", func(t *testing.T) {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }() // a failure must not leave the pool waiting on it at cleanup
		require.NoError(t, s.RefundTx(ctx, tx, "org-a", "agent-1", "llm", 2, "", "r3"))
		require.NoError(t, tx.Rollback(ctx))
		require.EqualValues(t, 2, mustGet(t, s, "org-a", m).Spent)
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return s.RefundTx(ctx, tx, "org-a", "agent-1", "llm", 2, "", "r3")
		}))
		require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent)
	})
	requireLedgerMatches(t, db)
}

// A repeated refund key refunds nothing again, whether or not spent would
// still cover a second refund: the key, not the balance, is what stops it.
func TestARepeatedRefundKeyLowersSpentOnceEvenWhileSpentStillCoversIt(t *testing.T) {
	tests := []struct {
		name      string
		spend     int64
		refunds   []int64 // amounts refunded under the one key, in order
		wantSpent int64
	}{
		{name: "repeated while spent still covers it", spend: 10, refunds: []int64{3, 3}, wantSpent: 7},
		{name: "repeated three times while spent covers them all", spend: 10, refunds: []int64{2, 2, 2}, wantSpent: 8},
		{name: "repeated with another amount spent covers", spend: 10, refunds: []int64{3, 5}, wantSpent: 7},
		{name: "repeated once spent no longer covers it", spend: 6, refunds: []int64{4, 4}, wantSpent: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, db := newTestService(t)
			ctx := context.Background()
			m := mustCreate(t, s, "org-a", "agent-1", "llm", 10)
			_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: tt.spend})
			require.NoError(t, err)

			for _, amount := range tt.refunds {
				require.NoError(t, s.Refund(ctx, "org-a", "agent-1", "llm", amount, "work never ran", "r1"))
			}

			require.Equal(t, tt.wantSpent, mustGet(t, s, "org-a", m).Spent)
			entries, _, err := s.Ledger(ctx, "org-a", AnyAgent, m.ID, Page{})
			require.NoError(t, err)
			require.Len(t, entries, 2, "one debit, one refund")
			require.Equal(t, -tt.refunds[0], entries[1].Amount)
			requireLedgerMatches(t, db)
		})
	}
}

// A refund key another org used is absent to an org: its own refund under
// that key is decided as any other (refused when it exceeds what was
// spent), never answered as a replay of the other org's.
func TestAnotherOrgsRefundKeyIsAbsentToAnOrg(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	for _, org := range []string{"org-a", "org-b"} {
		mustCreate(t, s, org, "agent-1", "llm", 10)
	}
	_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5})
	require.NoError(t, err)
	require.NoError(t, s.Refund(ctx, "org-a", "agent-1", "llm", 5, "", "shared"))

	var inv *apperr.InvalidError
	require.ErrorAs(t, s.Refund(ctx, "org-b", "agent-1", "llm", 5, "", "shared"), &inv, "org-b spent nothing")
	require.Equal(t, "amount", inv.Fields[0].Field)
	_, err = s.Spend(ctx, SpendParams{OrgID: "org-b", AgentID: "agent-1", Scope: "llm", Cost: 5})
	require.NoError(t, err)
	require.NoError(t, s.Refund(ctx, "org-b", "agent-1", "llm", 5, "", "shared"), "and the key is org-b's own to use")
	requireLedgerMatches(t, db)
}

func TestSpendMetricsCountDecisionsNotReplays(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := newTestService(t, Config{Registry: reg})
	ctx := context.Background()
	mustCreate(t, s, "org-a", "agent-1", "llm", 1)
	for range 2 {
		_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1, IdempotencyKey: "k"})
		require.NoError(t, err)
	}
	_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"ok": 1, "refused": 1}, gathered(t, reg, "reveille_mandates_spends_total", "result"))
}

// gathered returns the values of a counter family by the given label.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelValue(m, label)] = m.GetCounter().GetValue()
		}
	}
	return out
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// A spend queued in a caller's batch is decided in the caller's transaction
// beside the caller's own statements, one round trip for all: it commits or
// rolls back with them, and the approval request of a refusal has the id
// the queued spend announced before the batch was sent.
func TestAQueuedSpendIsDecidedInTheCallersBatchAndTransaction(t *testing.T) {
	tests := []struct {
		name     string
		cost     int64
		commit   bool
		ok       bool
		spent    int64
		requests int
	}{
		{name: "granted and committed", cost: 2, commit: true, ok: true, spent: 2},
		{name: "refused and committed", cost: 5, commit: true, requests: 1},
		{name: "granted and rolled back", cost: 2, ok: true},
		{name: "refused and rolled back", cost: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, db := newTestService(t)
			ctx := context.Background()
			m := mustCreate(t, s, "org-a", "agent-1", "llm", 3)
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			q, err := s.QueueSpend(b, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: tt.cost, IdempotencyKey: "k"})
			require.NoError(t, err)
			b.Queue(`SELECT count(*) FROM mandate_approvals WHERE org_id = 'org-a' AND id = $1`, q.ApprovalID)
			br := db.SendBatch(ctx, b)
			tx := br.Tx()
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = br.Exec()
			require.NoError(t, err)
			res, decided, err := q.Read(br)
			require.NoError(t, err)
			var found int
			require.NoError(t, br.QueryRow().Scan(&found))
			require.NoError(t, br.Close())
			if tt.commit {
				require.NoError(t, tx.Commit(ctx))
			} else {
				require.NoError(t, tx.Rollback(ctx))
			}

			require.True(t, decided)
			require.Equal(t, tt.ok, res.OK)
			if !tt.ok {
				require.Equal(t, q.ApprovalID, res.ApprovalID)
				require.Equal(t, 1, found, "the statement after the decision finds the request by the announced id")
			} else {
				require.Zero(t, found)
			}
			require.Equal(t, tt.spent, mustGet(t, s, "org-a", m).Spent)
			require.Equal(t, tt.requests, countApprovals(t, db, "org-a", StatePending))
			requireLedgerMatches(t, db)
		})
	}
}

func TestAQueuedSpendWhoseKeyWasUsedDecidesNothingAndAnswersTheFirst(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 3)
	p := SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 2, IdempotencyKey: "k"}
	first, err := s.Spend(ctx, p)
	require.NoError(t, err)

	b := &pgx.Batch{}
	q, err := s.QueueSpend(b, p)
	require.NoError(t, err)
	br := db.SendBatch(ctx, b)
	_, decided, err := q.Read(br)
	require.NoError(t, err)
	require.NoError(t, br.Close())
	require.False(t, decided)
	again, err := q.Answer(ctx, db)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.MandateID, again.MandateID)
	require.EqualValues(t, 2, mustGet(t, s, "org-a", m).Spent)

	_, err = s.QueueSpend(b, SpendParams{OrgID: "org-a", Scope: "llm", Cost: 1})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv, "a queued spend is validated as Spend is")
	require.Equal(t, "agent_id", inv.Fields[0].Field)
}

// spendBehindLock sends a spend of 5 (agent-1, llm) while another
// transaction holds the mandate's row, waits until it waits for the row
// (what names that transaction), and returns what waits for its answer.
func spendBehindLock(t *testing.T, s *Service, db *pgxpool.Pool, what string) func() (SpendResult, error) {
	t.Helper()
	type answer struct {
		r   SpendResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := s.Spend(context.Background(), SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5, Reason: "r"})
		done <- answer{r, err}
	}()
	require.Eventually(t, func() bool { return lockWaiters(t, db) > 0 }, testWait, pollEvery, "the spend waits for "+what)
	return func() (SpendResult, error) { a := <-done; return a.r, a.err }
}

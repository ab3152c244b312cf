package mandates

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

// hookCall is what a recording hook saw.
type hookCall struct {
	r Resolution
	// stateInTx and stateOutside are the request's state read through the
	// hook's transaction and through another connection.
	stateInTx, stateOutside string
}

// recorder is a resolve hook that records its calls and writes a row in the
// resolving transaction; fail makes it write and then fail.
type recorder struct {
	db    *pgxpool.Pool
	mu    sync.Mutex
	calls []hookCall
	fail  error
}

func newRecorder(t *testing.T, s *Service, db *pgxpool.Pool, kind string) *recorder {
	t.Helper()
	_, err := db.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS hook_rows (approval_id uuid, state text)`)
	require.NoError(t, err)
	rec := &recorder{db: db}
	s.RegisterResolveHook(kind, rec.hook)
	return rec
}

func (rec *recorder) hook(ctx context.Context, tx pgx.Tx, r Resolution) error {
	c := hookCall{r: r}
	if err := tx.QueryRow(ctx, `SELECT state FROM mandate_approvals WHERE id = $1`, r.ApprovalID).Scan(&c.stateInTx); err != nil {
		return err
	}
	if err := rec.db.QueryRow(ctx, `SELECT state FROM mandate_approvals WHERE id = $1`, r.ApprovalID).Scan(&c.stateOutside); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO hook_rows VALUES ($1, $2)`, r.ApprovalID, r.State); err != nil {
		return err
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.calls = append(rec.calls, c)
	return rec.fail
}

func (rec *recorder) snapshot() []hookCall {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]hookCall(nil), rec.calls...)
}

func hookRows(t *testing.T, db *pgxpool.Pool, id uuid.UUID) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT state FROM hook_rows WHERE approval_id = $1`, id)
	require.NoError(t, err)
	states, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return states
}

// refuse makes a refused spend carrying a payload of kind "test" and
// returns its approval id.
func refuse(t *testing.T, s *Service, org, scope string, cost int64, requestedBy string) uuid.UUID {
	t.Helper()
	r, err := s.Spend(context.Background(), SpendParams{OrgID: org, AgentID: "agent-1", Scope: scope, Cost: cost,
		Reason: "needs more", RequestedBy: requestedBy, OnResolve: &Payload{Kind: "test", Data: []byte(`{"n":1}`)}})
	require.NoError(t, err)
	require.False(t, r.OK)
	return r.ApprovalID
}

func TestApprovingChargesTheOverrunAndCallsTheHookOnceInTheResolvingTransaction(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 2)
	id := refuse(t, s, "org-a", "llm", 5, "agent-sub")

	a, err := s.Approve(ctx, "org-a", id, "human", "fine once")
	require.NoError(t, err)
	require.Equal(t, StateApproved, a.State)
	require.Equal(t, "human", a.ResolvedBy)
	require.Equal(t, "fine once", a.Note)
	require.NotNil(t, a.ResolvedAt)

	calls := rec.snapshot()
	require.Len(t, calls, 1)
	c := calls[0]
	require.Equal(t, Resolution{ApprovalID: id, OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 5,
		State: StateApproved, Payload: Payload{Kind: "test", Data: c.r.Payload.Data}, ResolvedBy: "human", Note: "fine once"}, c.r)
	require.JSONEq(t, `{"n":1}`, string(c.r.Payload.Data))
	require.Equal(t, StateApproved, c.stateInTx, "the hook runs inside the resolving transaction")
	require.Equal(t, StatePending, c.stateOutside, "before that transaction commits")
	require.Equal(t, []string{StateApproved}, hookRows(t, db, id), "the hook's writes commit with the resolution")

	got := mustGet(t, s, "org-a", m)
	require.EqualValues(t, 5, got.Spent, "spent passes the budget, visibly")
	require.EqualValues(t, 0, got.Remaining())
	entries, _, err := s.Ledger(ctx, "org-a", AnyAgent, m.ID, Page{})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, KindApprovedOverrun, entries[0].Kind)
	require.EqualValues(t, 5, entries[0].Amount)
	require.Equal(t, &id, entries[0].ApprovalID)
	requireLedgerMatches(t, db)

	t.Run("a second resolution is a conflict and calls nothing", func(t *testing.T) {
		_, err := s.Approve(ctx, "org-a", id, "human", "")
		require.ErrorIs(t, err, ErrAlreadyResolved)
		require.ErrorIs(t, err, apperr.ErrConflict)
		_, err = s.Deny(ctx, "org-a", id, "human", "")
		require.ErrorIs(t, err, ErrAlreadyResolved)
		require.Len(t, rec.snapshot(), 1)
		require.EqualValues(t, 5, mustGet(t, s, "org-a", m).Spent)
	})
}

func TestApprovingWithoutAMandateCreatesOneWithBudgetZero(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "fresh", 3, "")
	_, err := s.Approve(ctx, "org-a", id, "human", "")
	require.NoError(t, err)
	m, err := s.Find(ctx, "org-a", "agent-1", "fresh")
	require.NoError(t, err)
	require.EqualValues(t, 0, m.Budget)
	require.EqualValues(t, 3, m.Spent)
	require.Equal(t, StatusActive, m.Status)
	requireLedgerMatches(t, db)

	t.Run("the overrun does not let the next spend pass", func(t *testing.T) {
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "fresh", Cost: 1})
		require.NoError(t, err)
		require.False(t, r.OK)
	})
}

func TestDenyingCallsTheHookWithTheDenialAndChargesNothing(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 2)
	id := refuse(t, s, "org-a", "llm", 5, "")

	a, err := s.Deny(ctx, "org-a", id, "human", "no")
	require.NoError(t, err)
	require.Equal(t, StateDenied, a.State)
	calls := rec.snapshot()
	require.Len(t, calls, 1)
	require.Equal(t, StateDenied, calls[0].r.State)
	require.Equal(t, "no", calls[0].r.Note)
	require.Equal(t, StateDenied, calls[0].stateInTx)
	require.Equal(t, []string{StateDenied}, hookRows(t, db, id))
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent)

	_, err = s.Approve(ctx, "org-a", id, "human", "")
	require.ErrorIs(t, err, ErrAlreadyResolved)
	require.Len(t, rec.snapshot(), 1)
}

// A note is at most MaxText bytes of text: a longer or binary one is
// invalid, naming note, and the request stays pending.
func TestABadNoteIsRefusedAndLeavesTheRequestPending(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	mustCreate(t, s, "org-a", "agent-1", "llm", 2)
	id := refuse(t, s, "org-a", "llm", 5, "")
	for name, note := range map[string]string{"too long": strings.Repeat("n", MaxText+1), "with a NUL": "a\x00b"} {
		for _, resolve := range []func(context.Context, string, uuid.UUID, string, string) (Approval, error){s.Approve, s.Deny} {
			_, err := resolve(ctx, "org-a", id, "human", note)
			var inv *apperr.InvalidError
			require.ErrorAs(t, err, &inv, name)
			require.Equal(t, "note", inv.Fields[0].Field, name)
		}
	}
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.Empty(t, rec.snapshot(), "no hook called")
	_, err = s.Deny(ctx, "org-a", id, "human", strings.Repeat("n", MaxText))
	require.NoError(t, err, "a note of MaxText bytes is fine")
}

func TestAFailingHookRollsTheResolutionBack(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	rec.fail = errors.New("cannot fund the intent")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 0)
	id := refuse(t, s, "org-a", "llm", 5, "")

	_, err := s.Approve(ctx, "org-a", id, "human", "")
	require.ErrorIs(t, err, rec.fail)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent, "the charge rolled back too")
	require.Empty(t, hookRows(t, db, id), "the hook's own writes rolled back")

	rec.fail = nil
	_, err = s.Approve(ctx, "org-a", id, "human", "")
	require.NoError(t, err, "it can be resolved once the hook works")
	require.EqualValues(t, 5, mustGet(t, s, "org-a", m).Spent)
	requireLedgerMatches(t, db)
}

// Spent stays within MaxAmount, the largest amount the API carries: an
// approval whose charge would take it further is refused as a conflict,
// charging nothing, calling no hook and leaving the request pending, so that
// it can still be denied.
func TestAnApprovalThatWouldTakeSpentPastMaxAmountIsRefusedAndCanStillBeDenied(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	first := refuse(t, s, "org-a", "huge", MaxAmount-1, "")
	toTheBound := refuse(t, s, "org-a", "huge", 1, "")
	beyond := refuse(t, s, "org-a", "huge", 1, "")
	_, err := s.Approve(ctx, "org-a", first, "human", "")
	require.NoError(t, err)
	_, err = s.Approve(ctx, "org-a", toTheBound, "human", "")
	require.NoError(t, err, "spent may reach MaxAmount itself")

	_, err = s.Approve(ctx, "org-a", beyond, "human", "")
	require.ErrorIs(t, err, ErrSpentBeyondMax)
	require.ErrorIs(t, err, apperr.ErrConflict)
	require.Contains(t, err.Error(), "2^53−1")
	m, err := s.Find(ctx, "org-a", "agent-1", "huge")
	require.NoError(t, err)
	require.EqualValues(t, MaxAmount, m.Spent)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, beyond)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
	require.Empty(t, hookRows(t, db, beyond), "no hook called")
	require.Len(t, rec.snapshot(), 2)

	a, err = s.Deny(ctx, "org-a", beyond, "human", "too much")
	require.NoError(t, err)
	require.Equal(t, StateDenied, a.State)
	requireLedgerMatches(t, db)
}

func TestAPayloadKindWithoutAHookCannotBeResolved(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	id := refuse(t, s, "org-a", "llm", 5, "")
	_, err := s.Deny(ctx, "org-a", id, "human", "")
	require.ErrorIs(t, err, ErrNoHook)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
}

func TestARequestWithoutAPayloadResolvesWithoutAHook(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	a, err := s.Approve(ctx, "org-a", r.ApprovalID, "human", "")
	require.NoError(t, err)
	require.Nil(t, a.OnResolve)
	require.Equal(t, StateApproved, a.State)
}

func TestTheRequesterCannotResolveItsOwnRequest(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "alice")
	for _, resolve := range []func(context.Context, string, uuid.UUID, string, string) (Approval, error){s.Approve, s.Deny} {
		_, err := resolve(ctx, "org-a", id, "alice", "")
		require.ErrorIs(t, err, ErrSelfApproval)
		require.ErrorIs(t, err, apperr.ErrForbidden)
	}
	require.Empty(t, rec.snapshot())
	_, err := s.Approve(ctx, "org-a", id, "bob", "")
	require.NoError(t, err)
}

func TestAnotherOrgsRequestIsNotFound(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "")
	_, err := s.GetApproval(ctx, "org-b", AnyAgent, id)
	require.ErrorIs(t, err, ErrApprovalNotFound)
	_, err = s.Approve(ctx, "org-b", id, "human", "")
	require.ErrorIs(t, err, ErrApprovalNotFound)
	require.ErrorIs(t, err, apperr.ErrNotFound)
	_, err = s.Deny(ctx, "org-b", id, "human", "")
	require.ErrorIs(t, err, ErrApprovalNotFound)
	_, err = s.Approve(ctx, "org-a", uuid.New(), "human", "")
	require.ErrorIs(t, err, ErrApprovalNotFound)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StatePending, a.State)
}

func TestAnotherAgentsRequestIsNotFoundByALookupNarrowedToAnAgent(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "") // agent-1's

	_, err := s.GetApproval(ctx, "org-a", "agent-2", id)
	require.ErrorIs(t, err, ErrApprovalNotFound)
	a, err := s.GetApproval(ctx, "org-a", "agent-1", id)
	require.NoError(t, err)
	require.Equal(t, "agent-1", a.AgentID)
}

func TestConcurrentResolutionsResolveOnce(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "")
	const n = 16
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			if i%2 == 0 {
				_, errs[i] = s.Approve(ctx, "org-a", id, "human", "")
			} else {
				_, errs[i] = s.Deny(ctx, "org-a", id, "human", "")
			}
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			require.ErrorIs(t, err, ErrAlreadyResolved)
		}
	}
	require.Equal(t, 1, won)
	require.Len(t, rec.snapshot(), 1)
	require.Len(t, hookRows(t, db, id), 1)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	var charges int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM mandate_ledger WHERE approval_id = $1`, id).Scan(&charges))
	if a.State == StateApproved {
		require.Equal(t, 1, charges)
		requireLedgerMatches(t, db)
	} else {
		require.Equal(t, StateDenied, a.State)
		require.Zero(t, charges)
	}
}

func TestACanceledRequestCallsNoHookAndCannotBeResolved(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	id := refuse(t, s, "org-a", "llm", 5, "")

	cancel := func(org string) bool {
		var ok bool
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var err error
			ok, err = s.CancelApprovalTx(ctx, tx, org, id)
			return err
		}))
		return ok
	}
	require.False(t, cancel("org-b"), "another org's request is not canceled")
	require.True(t, cancel("org-a"))
	require.False(t, cancel("org-a"), "only a pending request cancels")
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, a.State)
	require.Empty(t, rec.snapshot())
	_, err = s.Approve(ctx, "org-a", id, "human", "")
	require.ErrorIs(t, err, ErrAlreadyResolved)
}

func TestResolvingAnOverdueRequestExpiresItInstead(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	rec := newRecorder(t, s, db, "test")
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 0)
	id := refuse(t, s, "org-a", "llm", 5, "")
	makeOverdue(t, db, id)

	_, err := s.Approve(ctx, "org-a", id, "human", "")
	require.ErrorIs(t, err, ErrAlreadyResolved)
	a, err := s.GetApproval(ctx, "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, StateExpired, a.State)
	calls := rec.snapshot()
	require.Len(t, calls, 1)
	require.Equal(t, StateExpired, calls[0].r.State)
	require.EqualValues(t, 0, mustGet(t, s, "org-a", m).Spent)
}

func makeOverdue(t *testing.T, db *pgxpool.Pool, id uuid.UUID) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE mandate_approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
}

func TestApprovalRequestsExpireAfterTheConfiguredTTL(t *testing.T) {
	s, _ := newTestService(t, Config{ApprovalTTL: 90 * time.Minute})
	id := refuse(t, s, "org-a", "llm", 5, "")
	a, err := s.GetApproval(context.Background(), "org-a", AnyAgent, id)
	require.NoError(t, err)
	require.Equal(t, 90*time.Minute, a.ExpiresAt.Sub(a.CreatedAt).Round(time.Second))
}

func TestListApprovalsFiltersByStatusAndPages(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	var ids []uuid.UUID
	for range 5 {
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
		require.NoError(t, err)
		ids = append(ids, r.ApprovalID)
	}
	_, err := s.Spend(ctx, SpendParams{OrgID: "org-b", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	_, err = s.Deny(ctx, "org-a", ids[1], "human", "")
	require.NoError(t, err)

	require.Equal(t, []uuid.UUID{ids[0], ids[2], ids[3], ids[4]}, listApprovalIDs(t, s, "org-a", ApprovalFilter{State: StatePending}))

	all, next, err := s.ListApprovals(ctx, "org-a", ApprovalFilter{}, Page{})
	require.NoError(t, err)
	require.Nil(t, next)
	require.Len(t, all, 5, "another org's requests are not listed")
	denied, _, err := s.ListApprovals(ctx, "org-a", ApprovalFilter{State: StateDenied}, Page{})
	require.NoError(t, err)
	require.Len(t, denied, 1)
	none, _, err := s.ListApprovals(ctx, "org-a", ApprovalFilter{AgentID: "agent-2"}, Page{})
	require.NoError(t, err)
	require.Empty(t, none)

	_, _, err = s.ListApprovals(ctx, "org-a", ApprovalFilter{State: "bogus"}, Page{})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "status", inv.Fields[0].Field)
}

func TestListApprovalsNewestFirstPagesBackToTheOldest(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	var ids []uuid.UUID
	for range 5 {
		r, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
		require.NoError(t, err)
		ids = append(ids, r.ApprovalID)
	}
	_, err := s.Spend(ctx, SpendParams{OrgID: "org-b", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.NoError(t, err)
	_, err = s.Deny(ctx, "org-a", ids[3], "human", "")
	require.NoError(t, err)

	require.Equal(t, []uuid.UUID{ids[4], ids[3], ids[2], ids[1], ids[0]}, listApprovalIDs(t, s, "org-a", ApprovalFilter{NewestFirst: true}),
		"another org's request is not listed")
	require.Equal(t, []uuid.UUID{ids[4], ids[2], ids[1], ids[0]}, listApprovalIDs(t, s, "org-a", ApprovalFilter{State: StatePending, NewestFirst: true}))
}

// listApprovalIDs pages through the org's requests f lists, two a page,
// and returns their ids in the order listed.
func listApprovalIDs(t *testing.T, s *Service, org string, f ApprovalFilter) []uuid.UUID {
	t.Helper()
	var seen []uuid.UUID
	page := Page{Limit: 2}
	for {
		items, next, err := s.ListApprovals(context.Background(), org, f, page)
		require.NoError(t, err)
		for _, a := range items {
			seen = append(seen, a.ID)
		}
		if next == nil {
			return seen
		}
		page.Cursor = *next
	}
}

func TestResolutionMetricsCountByState(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, db := newTestService(t, Config{Registry: reg})
	ctx := context.Background()
	newRecorder(t, s, db, "test")
	a := refuse(t, s, "org-a", "llm", 5, "")
	d := refuse(t, s, "org-a", "llm", 5, "")
	e := refuse(t, s, "org-a", "llm", 5, "")
	_, err := s.Approve(ctx, "org-a", a, "human", "")
	require.NoError(t, err)
	_, err = s.Deny(ctx, "org-a", d, "human", "")
	require.NoError(t, err)
	makeOverdue(t, db, e)
	n, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, map[string]float64{StateApproved: 1, StateDenied: 1, StateExpired: 1, StateCanceled: 0},
		gathered(t, reg, "reveille_mandates_approvals_resolved_total", "state"))
	require.Equal(t, map[string]float64{"": 1}, gathered(t, reg, "reveille_mandates_approvals_expired_total", "state"))
}

package wakeup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// createTogether runs ps through one group, as Create calls that arrive
// together go, and returns what each Create returns.
func (f *fixture) createTogether(t *testing.T, ps ...CreateParams) ([]Wakeup, []error) {
	t.Helper()
	ctx := context.Background()
	ws, errs := make([]Wakeup, len(ps)), make([]error, len(ps))
	var reqs []*createRequest
	index := map[*createRequest]int{}
	for i := range ps {
		if errs[i] = f.svc.validate(ctx, &ps[i]); errs[i] != nil {
			continue
		}
		r := &createRequest{p: ps[i], ctx: context.Background(), reply: make(chan createReply, 1)}
		reqs, index[r] = append(reqs, r), i
	}
	f.svc.createGroup(ctx, reqs)
	for _, r := range reqs {
		i := index[r]
		ws[i], errs[i] = f.svc.settle(ctx, ps[i], <-r.reply)
	}
	return ws, errs
}

// A group decides each of its requests as the request alone would be
// decided: funded and enqueued, refused by its mandate, refused as invalid
// before anything is written, or replayed under its idempotency key.
func TestAGroupDecidesEachRequestAsItWouldBeDecidedAlone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	keyed := params("")
	keyed.IdempotencyKey = "earlier"
	earlier, err := f.svc.Create(ctx, keyed)
	require.NoError(t, err)

	overBudget, otherOrg, tooDear, twice := params(""), params(""), params(""), params("")
	overBudget.Cost = 50
	otherOrg.OrgID, otherOrg.WorkflowID = "o2", "o2/wf"
	tooDear.Cost = mandates.MaxAmount + 1
	twice.IdempotencyKey = "twice"
	ws, errs := f.createTogether(t, params(""), overBudget, otherOrg, tooDear, keyed, twice, twice)

	t.Run("funded and enqueued", func(t *testing.T) {
		require.NoError(t, errs[0])
		require.Equal(t, "enqueued", f.state(t, ws[0].ID))
		require.NotNil(t, ws[0].WorkID)
		got, err := f.svc.Get(ctx, "o", AnyAgent, ws[0].ID)
		require.NoError(t, err)
		require.Equal(t, got.WorkID, ws[0].WorkID)
		require.Equal(t, got.CreatedAt, ws[0].CreatedAt, "what Create returns is what was written")
		require.Equal(t, got.UpdatedAt, ws[0].UpdatedAt)
		require.Equal(t, StatusPending, ws[0].Status)
		require.Equal(t, DeliveryWaiting, ws[0].Delivery.State)
	})
	t.Run("refused by its mandate", func(t *testing.T) {
		var refused *RefusedError
		require.ErrorAs(t, errs[1], &refused)
		require.Equal(t, mandates.RefusalInsufficient, refused.Refusal)
		require.Equal(t, "awaiting_approval", f.state(t, ws[1].ID))
		got, err := f.svc.Get(ctx, "o", AnyAgent, ws[1].ID)
		require.NoError(t, err)
		require.Equal(t, &Approval{ID: refused.ApprovalID, State: mandates.StatePending}, got.Approval)
		require.Equal(t, got.Approval, ws[1].Approval)
	})
	t.Run("another org's, refused by its own mandates", func(t *testing.T) {
		var refused *RefusedError
		require.ErrorAs(t, errs[2], &refused)
		require.Equal(t, mandates.RefusalNoMandate, refused.Refusal)
		_, err := f.svc.Get(ctx, "o", AnyAgent, ws[2].ID)
		require.ErrorIs(t, err, ErrNotFound, "filed under its own org")
		_, err = f.svc.Get(ctx, "o2", AnyAgent, ws[2].ID)
		require.NoError(t, err)
	})
	t.Run("invalid for its mandate, refused before anything is written", func(t *testing.T) {
		var inv *apperr.InvalidError
		require.ErrorAs(t, errs[3], &inv)
		require.Equal(t, "cost", inv.Fields[0].Field)
		require.Equal(t, uuid.Nil, ws[3].ID)
	})
	t.Run("an earlier key, replayed", func(t *testing.T) {
		require.NoError(t, errs[4])
		require.Equal(t, earlier.ID, ws[4].ID)
	})
	t.Run("a key twice in the group, created once", func(t *testing.T) {
		require.NoError(t, errs[5])
		require.NoError(t, errs[6])
		require.Equal(t, ws[5].ID, ws[6].ID)
	})
	require.Equal(t, 5, f.wakeupCount(t), "earlier, funded, over budget, the other org's, twice")
	require.EqualValues(t, 9, f.spent(t), "earlier, funded and twice: one spend each")
}

// A group shares its transactions: however many requests it carries, it
// costs four round trips (the spends' commit waits one for the approvals
// inbox's events of refusals), two commits and one NOTIFY.
func TestAGroupOfRequestsSharesItsRoundTripsCommitsAndNotify(t *testing.T) {
	rt := &testkit.RoundTrips{}
	f := newFixtureWith(t, fixtureOptions{trace: rt})
	_, err := f.mandates.Create(context.Background(), "o", mandates.CreateParams{AgentID: "b", Scope: "s", Budget: 10})
	require.NoError(t, err)
	ps := make([]CreateParams, 6)
	for i := range ps {
		ps[i] = params("")
		ps[i].WorkflowID = fmt.Sprintf("o/wf-%d", i)
		if i%2 == 1 {
			ps[i].AgentID = "b"
		}
	}
	f.createTogether(t, ps[:1]...) // warm-up: statements prepared
	rt.Take()

	ws, errs := f.createTogether(t, ps[1:]...)

	trips := rt.Take()
	for i := range ws {
		require.NoError(t, errs[i])
		require.Equal(t, "enqueued", f.state(t, ws[i].ID))
	}
	all := strings.Join(trips, "\n")
	require.Len(t, trips, 4, all)
	require.Equal(t, 2, strings.Count(all, "COMMIT"), all)
	require.Equal(t, 1, strings.Count(all, "pg_notify"), all)
}

// A group's refusals append their approvals inbox events in two round
// trips however many they are (their requests read, then the appends),
// beside the three of a group the mandates refused whole: appended one
// after another they cost two each, all while the group held its mandates
// and the org's event counter.
func TestAGroupOfRefusalsAppendsItsEventsInTwoRoundTrips(t *testing.T) {
	rt := &testkit.RoundTrips{}
	var appended []inbox.Event
	f := newFixtureWith(t, fixtureOptions{trace: rt, onAppend: func(_ context.Context, _ db.Querier, ev inbox.Event) error {
		appended = append(appended, ev)
		return nil
	}})
	warm := params("")
	warm.Cost = 50
	f.createTogether(t, warm) // warm-up: statements prepared
	rt.Take()
	appended = nil

	ps := make([]CreateParams, 5)
	for i := range ps {
		ps[i] = params("")
		ps[i].Cost = 50 // past the budget of 10: refused
		ps[i].WorkflowID = fmt.Sprintf("o/wf-%d", i)
	}
	_, errs := f.createTogether(t, ps...)

	trips := rt.Take()
	ids := map[uuid.UUID]bool{}
	for _, err := range errs {
		var refused *RefusedError
		require.ErrorAs(t, err, &refused)
		ids[refused.ApprovalID] = true
	}
	require.Len(t, trips, 5, strings.Join(trips, "\n"))
	require.Len(t, appended, 5, "one event a refusal, each hooked")
	for i, ev := range appended {
		require.True(t, ids[ev.ApprovalID], "the event of a refusal of the group")
		require.Contains(t, string(ev.Approval), ev.ApprovalID.String(), "the approval object as its GET route shows it")
		if i > 0 {
			require.Equal(t, appended[i-1].Seq+1, ev.Seq, "consecutive seqs")
		}
	}
}

// A statement the server refuses rolls the whole gate of a group back; its
// requests then go alone, so one request's failure is its own.
func TestARequestThatFailsInItsGroupFailsAloneAndTheOthersAreCreated(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A fault valid input cannot cause: a trigger refuses agent "faulty"'s
	// intents.
	_, err := f.db.Exec(ctx, `
		CREATE FUNCTION refuse_faulty() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.agent_id = 'faulty' THEN RAISE EXCEPTION 'faulty agent'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_faulty BEFORE INSERT ON wakeups FOR EACH ROW EXECUTE FUNCTION refuse_faulty();`)
	require.NoError(t, err)
	faulty := params("")
	faulty.AgentID = "faulty"

	ws, errs := f.createTogether(t, params(""), faulty, params(""))

	require.ErrorContains(t, errs[1], "faulty agent")
	for _, i := range []int{0, 2} {
		require.NoError(t, errs[i])
		require.Equal(t, "enqueued", f.state(t, ws[i].ID))
	}
	require.Equal(t, 2, f.wakeupCount(t))
	require.EqualValues(t, 6, f.spent(t))
}

// An approval event's hook that joins the transaction it is handed (an
// approval webhook's enqueue) joins the group's gate: given the bare
// connection it began and committed a transaction of its own, which
// committed the gate half done; a later failure then sent every request
// through again alone, spending twice for the funded one and leaving the
// failed one's approval request behind.
func TestAnApprovalEventsHookWritesInTheGroupsTransaction(t *testing.T) {
	f := newFixtureWith(t, fixtureOptions{onAppend: func(ctx context.Context, q db.Querier, ev inbox.Event) error {
		return db.InTx(ctx, q, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO test_hooked (seq) VALUES ($1)`, ev.Seq)
			return err
		})
	}})
	ctx := context.Background()
	// A fault valid input cannot cause: the event of agent "faulty"'s
	// refusal fails, after the refused request's event and its hook ran.
	_, err := f.db.Exec(ctx, `
		CREATE TABLE test_hooked (seq bigint);
		CREATE FUNCTION refuse_faulty() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.payload->>'agent_id' = 'faulty' THEN RAISE EXCEPTION 'faulty event'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_faulty BEFORE INSERT ON approval_events FOR EACH ROW EXECUTE FUNCTION refuse_faulty();`)
	require.NoError(t, err)
	funded, refused, faulty := params(""), params(""), params("")
	refused.Cost = 50 // past the budget of 10
	faulty.AgentID = "faulty"

	ws, errs := f.createTogether(t, funded, refused, faulty)

	require.NoError(t, errs[0])
	require.Equal(t, "enqueued", f.state(t, ws[0].ID))
	var refusedErr *RefusedError
	require.ErrorAs(t, errs[1], &refusedErr)
	require.ErrorContains(t, errs[2], "faulty event")
	require.EqualValues(t, 3, f.spent(t), "the funded request spent once")
	require.Equal(t, 2, f.wakeupCount(t), "the failed request left no wake-up")
	var approvals, hooked int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM mandate_approvals), (SELECT count(*) FROM test_hooked)`).
		Scan(&approvals, &hooked))
	require.Equal(t, 1, approvals, "one approval request: the refused one's")
	require.Equal(t, 1, hooked, "its event's hook ran once, in the transaction that committed it")
}

// A panic in a group (a bug; here a hook that panics on agent "faulty"'s
// refusal) before the group's commit sends its requests alone: the others
// are created, and the panic surfaces again in the faulty request's own
// goroutine (the HTTP layer's recovery answers it 500), not in the group's,
// which serves every org and whose panic ended the process.
func TestAPanicInAGroupBeforeItsCommitSendsItsRequestsAlone(t *testing.T) {
	f := newFixtureWith(t, fixtureOptions{onAppend: func(_ context.Context, _ db.Querier, ev inbox.Event) error {
		if strings.Contains(string(ev.Approval), `"faulty"`) {
			panic("a hook's bug")
		}
		return nil
	}})
	ctx := context.Background()
	faulty, other := params(""), params("")
	faulty.AgentID, faulty.Cost = "faulty", 50 // refused: its event runs the hook
	other.WorkflowID = "o/other"
	require.NoError(t, f.svc.validate(ctx, &faulty))
	require.NoError(t, f.svc.validate(ctx, &other))

	reqs := []*createRequest{
		{p: faulty, ctx: ctx, reply: make(chan createReply, 1)},
		{p: other, ctx: ctx, reply: make(chan createReply, 1)},
	}
	require.NotPanics(t, func() { f.svc.createGroup(ctx, reqs) })
	for _, r := range reqs {
		require.True(t, (<-r.reply).alone, "nothing committed: %s goes alone", r.p.AgentID)
	}
	w, err := f.svc.createAlone(ctx, other)
	require.NoError(t, err)
	require.Equal(t, "enqueued", f.state(t, w.ID))
	require.PanicsWithValue(t, "a hook's bug", func() { _, _ = f.svc.createAlone(ctx, faulty) })

	// Through Create the group's goroutine lives on: the next request is served.
	require.PanicsWithValue(t, "a hook's bug", func() { _, _ = f.svc.Create(ctx, faulty) })
	w, err = f.svc.Create(ctx, params(""))
	require.NoError(t, err)
	require.Equal(t, "enqueued", f.state(t, w.ID))
}

// A panic after the group's commit fails its requests rather than sending
// them alone, which would spend twice: what the gate committed stands, and
// the funded wake-up is left to the reconciler.
func TestAPanicInAGroupAfterItsCommitFailsItsRequests(t *testing.T) {
	f := newFixture(t)
	f.panicAfterGate = true
	_, errs := f.createTogether(t, params(""))
	require.ErrorContains(t, errs[0], "a bug after the gate")
	require.EqualValues(t, 3, f.spent(t), "spent once")
	require.Equal(t, 1, f.wakeupCount(t))
}

// The pending cap is decided per org in a group, before the spend: the org
// at its cap is refused and leaves nothing; the other org's request goes on.
func TestAGroupRefusesOnlyTheOrgAtItsPendingCapAndBeforeItsSpend(t *testing.T) {
	f := newFixtureCapped(t, 1)
	ctx := context.Background()
	_, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)
	_, err = f.mandates.Create(ctx, "o2", mandates.CreateParams{AgentID: "a", Scope: "s", Budget: 10})
	require.NoError(t, err)
	other := params("")
	other.OrgID, other.WorkflowID = "o2", "o2/wf"

	ws, errs := f.createTogether(t, params(""), other)

	require.ErrorIs(t, errs[0], workpool.ErrTooManyPending)
	require.NoError(t, errs[1])
	require.Equal(t, "enqueued", f.state(t, ws[1].ID))
	require.Equal(t, 2, f.wakeupCount(t), "the refused intent is not left behind")
	require.EqualValues(t, 3, f.spent(t), "nothing spent for the refused one")
}

// Concurrent requests, grouped however they arrive, never spend past a
// budget, and every one is settled: enqueued with its own work, or
// awaiting approval with its own request; a key sent twice is one wake-up.
func TestConcurrentRequestsNeverOverspendAndEachIsSettled(t *testing.T) {
	tests := []struct {
		name    string
		keyed   bool // each key is sent by two requests
		created int
	}{
		{name: "without keys", created: 40},
		{name: "each key sent twice", keyed: true, created: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			_, err := f.mandates.Create(ctx, "o", mandates.CreateParams{AgentID: "c", Scope: "s", Budget: 15})
			require.NoError(t, err)
			ws, errs := make([]Wakeup, 40), make([]error, 40)
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Go(func() {
					p := params("")
					p.AgentID, p.Cost = "c", 1
					if tt.keyed {
						p.IdempotencyKey = fmt.Sprintf("k-%d", i/2)
					}
					ws[i], errs[i] = f.svc.Create(ctx, p)
				})
			}
			wg.Wait()

			ids, works := map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
			funded, refused := 0, 0
			for i := range ws {
				var r *RefusedError
				switch {
				case errs[i] == nil:
					// (a replay may come before its first request's enqueue)
					if ws[i].WorkID != nil {
						works[*ws[i].WorkID] = true
					}
					funded++
				case errors.As(errs[i], &r):
					refused++
				default:
					require.NoError(t, errs[i])
				}
				ids[ws[i].ID] = true
			}
			require.Len(t, ids, tt.created)
			m, err := f.mandates.Find(ctx, "o", "c", "s")
			require.NoError(t, err)
			require.EqualValues(t, 15, m.Spent, "the budget, exactly")
			var enqueued, awaiting, approvals, work int
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'enqueued'), count(*) FILTER (WHERE state = 'awaiting_approval')
				FROM wakeups WHERE agent_id = 'c'`).Scan(&enqueued, &awaiting))
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM mandate_approvals WHERE agent_id = 'c'`).Scan(&approvals))
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work`).Scan(&work))
			require.Equal(t, 15, enqueued)
			require.Equal(t, tt.created-15, awaiting)
			require.Equal(t, tt.created-15, approvals)
			require.Equal(t, 15, work)
			var distinct int
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(DISTINCT work_id) FROM wakeups WHERE agent_id = 'c'`).Scan(&distinct))
			require.Equal(t, 15, distinct, "each enqueued wake-up has its own work")
			require.LessOrEqual(t, len(works), 15)
			require.Equal(t, 40, funded+refused)
		})
	}
}

// The pending cap (REVEILLE_ORG_MAX_PENDING) holds for a group as for the
// same requests one after another: a group carrying ten requests of an org
// with room for two admits two and refuses the rest, not all ten on the
// strength of "one more fits".
func TestAGroupAdmitsNoMoreOfAnOrgsRequestsThanItsPendingCapLeavesRoom(t *testing.T) {
	f := newFixtureCapped(t, 2)
	ps := make([]CreateParams, 10)
	for i := range ps {
		ps[i] = params("")
		ps[i].Cost = 0 // the mandate refuses none
		ps[i].WorkflowID = fmt.Sprintf("o/wf-%d", i)
	}

	_, errs := f.createTogether(t, ps...)

	created := 0
	for _, err := range errs {
		if err == nil {
			created++
		} else {
			require.ErrorIs(t, err, workpool.ErrTooManyPending)
			require.ErrorContains(t, err, "the first 2 requests of this one's group took the room left under its cap of 2")
		}
	}
	require.Equal(t, 2, created, "the cap is 2")
	require.Equal(t, 2, f.pendingWork(t), "nothing enqueued for the refused")
}

// A retry under an Idempotency-Key whose wake-up exists replays it, even
// while its org is past its pending cap (an approved overrun's work is
// enqueued whatever the cap). Its group inserts nothing for it, and the cap
// was decided for zero requests, whose refusal counted −1 on a Prometheus
// counter: a panic in the group's goroutine, which killed the process.
func TestAReplayWhileTheOrgIsPastItsPendingCapIsAnswered(t *testing.T) {
	f := newFixtureCapped(t, 1)
	ctx := context.Background()
	over := params("")
	over.Cost, over.WorkflowID, over.RequestedBy = 50, "o/over", "agent-sub"
	_, err := f.svc.Create(ctx, over)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	keyed := params("")
	keyed.IdempotencyKey = "k"
	first, err := f.svc.Create(ctx, keyed)
	require.NoError(t, err) // the org's one pending item: at its cap
	_, err = f.mandates.Approve(ctx, "o", refused.ApprovalID, "approver", "")
	require.NoError(t, err) // its work is owed: enqueued past the cap
	require.Equal(t, 2, f.pendingWork(t))

	var ws []Wakeup
	var errs []error
	require.NotPanics(t, func() { ws, errs = f.createTogether(t, keyed) })
	require.NoError(t, errs[0])
	require.Equal(t, first.ID, ws[0].ID)
}

// Concurrent requests, grouped as they arrive, stop near the pending cap:
// two groups run at once and neither sees the other's enqueues, so each
// may take the room it counted — never every request of the org.
func TestConcurrentRequestsOfAnOrgStopNearItsPendingCap(t *testing.T) {
	f := newFixtureCapped(t, 10)
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for i := range errs {
		wg.Go(func() {
			p := params("")
			p.Cost = 0
			p.WorkflowID = fmt.Sprintf("o/wf-%d", i)
			_, errs[i] = f.svc.Create(context.Background(), p)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, workpool.ErrTooManyPending)
		}
	}
	require.LessOrEqual(t, f.pendingWork(t), 20, "cap 10, two groups at once")
}

// A request whose caller gave up while it waited for a group (both busy)
// is answered with its context's error, and nothing is done for it: not
// charged, not created — a caller told that its request failed, and never
// given the wake-up's id, would pay for one it does not know of.
func TestARequestWhoseCallerLeftBeforeItsGroupBeganIsNotRun(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// both groups wait for the mandate's row
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM mandates WHERE org_id = 'o' AND agent_id = 'a' FOR UPDATE`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	c := f.svc.creator
	for i := range 2 {
		// one at a time: sent together, both may join the first group
		wg.Go(func() {
			p := params("")
			p.Cost, p.WorkflowID = 1, fmt.Sprintf("o/busy-%d", i)
			_, err := f.svc.Create(ctx, p)
			assert.NoError(t, err)
		})
		require.Eventually(t, func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.running == i+1 && len(c.pending) == 0
		}, 10*time.Second, time.Millisecond, "group %d runs", i+1)
	}

	left, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	p := params("")
	p.Cost, p.WorkflowID = 1, "o/left"
	_, err = f.svc.Create(left, p)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller is told its request failed")

	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.running == 0 && len(c.pending) == 0
	}, 5*time.Second, time.Millisecond, "every request taken")
	var n int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM wakeups WHERE workflow_id = 'o/left'`).Scan(&n))
	require.Zero(t, n, "no wake-up for the caller that left")
	require.EqualValues(t, 2, f.spent(t), "the two others charged, not the third")
}

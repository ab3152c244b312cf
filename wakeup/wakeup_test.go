package wakeup

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/startstop"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workpool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// These tests drive the service without Temporal or running pool loops:
// the state of intents, spends and queued signals. The round trip through
// a real Temporal server is in internal/e2e.

type fixture struct {
	db         *pgxpool.Pool
	pool       *workpool.Manager
	mandates   *mandates.Service
	svc        *Service
	dispatcher *queue.Dispatcher // nil unless fixtureOptions.signals
	crash      bool
	// panicAfterGate panics between the gate's commit and the enqueue.
	panicAfterGate bool
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, fixtureOptions{}) }

// newFixtureCapped caps each org's pending work per pool at maxPending
// (0: the default).
func newFixtureCapped(t *testing.T, maxPending int) *fixture {
	return newFixtureWith(t, fixtureOptions{maxPending: maxPending})
}

type fixtureOptions struct {
	maxPending int
	// signals, when set, keeps the pool running (it is stopped once its
	// pools exist otherwise) and starts a dispatcher sending through it,
	// handed to the service as this process's.
	signals      queue.Signaler
	handoffLease time.Duration
	// trace, when set, counts the round trips of the fixture's database.
	trace *testkit.RoundTrips
	// logger, when set, is the service's and the dispatcher's (default
	// testkit.Logger).
	logger *slog.Logger
	// onAppend, when set, runs in the transaction of each approval event
	// the mandates append (inbox.Log.OnAppend, as the service wires its
	// approval webhooks there).
	onAppend func(ctx context.Context, q db.Querier, ev inbox.Event) error
	// mandatesRegistry, when set, receives the mandates' metrics.
	mandatesRegistry prometheus.Registerer
}

func newFixtureWith(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	f := &fixture{}
	if o.logger == nil {
		o.logger = testkit.Logger(t)
	}
	if o.trace != nil {
		cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
		require.NoError(t, err)
		cfg.ConnConfig.Tracer = o.trace
		f.db, err = pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(f.db.Close)
	} else {
		f.db = testkit.NewPool(t)
	}
	if o.signals != nil {
		f.dispatcher = queue.NewDispatcher(f.db, o.signals, queue.DispatcherConfig{HandoffLease: o.handoffLease, Logger: o.logger})
		require.NoError(t, f.dispatcher.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, f.dispatcher.Stop(context.Background())) })
	}
	var err error
	f.pool, err = workpool.New(f.db, workpool.Config{Pools: map[string]int{"wakeup": 5, "doomed": 5}, Logger: testkit.Logger(t),
		MaxPendingPerOrg: o.maxPending})
	require.NoError(t, err)
	f.pool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
	mcfg := mandates.Config{Logger: testkit.Logger(t), Registry: o.mandatesRegistry}
	if o.onAppend != nil {
		mcfg.Inbox = inbox.New(f.db, inbox.Config{Logger: testkit.Logger(t)})
		mcfg.Inbox.OnAppend = o.onAppend
	}
	f.mandates = mandates.New(f.db, mcfg)
	f.svc = New(f.db, f.pool, f.mandates, Config{ReconcileAfter: time.Millisecond, Logger: o.logger, Dispatcher: f.dispatcher,
		BeforeEnqueue: func(context.Context, uuid.UUID) error {
			if f.crash {
				return errors.New("crash between the transactions")
			}
			if f.panicAfterGate {
				panic("a bug after the gate")
			}
			return nil
		}})
	require.NoError(t, f.pool.Start(context.Background())) // creates the pools
	if o.signals != nil {
		t.Cleanup(func() { require.NoError(t, f.pool.Stop(context.Background())) })
	} else {
		require.NoError(t, f.pool.Stop(context.Background()))
	}
	_, err = f.mandates.Create(context.Background(), "o", mandates.CreateParams{AgentID: "a", Scope: "s", Budget: 10})
	require.NoError(t, err)
	return f
}

func params(pool string) CreateParams {
	return CreateParams{OrgID: "o", AgentID: "a", WorkflowID: "o/wf", Signal: "wake", Scope: "s", Cost: 3,
		Work: Work{Handler: "echo", Args: json.RawMessage(`{}`)}, Pool: pool}
}

// pendingWork is how many work items org o has.
func (f *fixture) pendingWork(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE org_id = 'o'`).Scan(&n))
	return n
}

func (f *fixture) spent(t *testing.T) int64 {
	t.Helper()
	m, err := f.mandates.Find(context.Background(), "o", "a", "s")
	require.NoError(t, err)
	return m.Spent
}

func (f *fixture) state(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT state FROM wakeups WHERE id = $1`, id).Scan(&s))
	return s
}

func TestFundedWakeupIsEnqueuedInTheSecondTransaction(t *testing.T) {
	f := newFixture(t)
	w, err := f.svc.Create(context.Background(), params(""))
	require.NoError(t, err)
	require.Equal(t, "enqueued", f.state(t, w.ID))
	require.Equal(t, DefaultPool, w.Pool)
	require.NotNil(t, w.WorkID)
	require.Equal(t, StatusPending, w.Status)
	require.Equal(t, DeliveryWaiting, w.Delivery.State)
	require.EqualValues(t, 3, f.spent(t))
}

func TestCrashBetweenTheTransactionsLeavesAFundedIntentTheReconcilerEnqueues(t *testing.T) {
	f := newFixture(t)
	f.crash = true
	w, err := f.svc.Create(context.Background(), params(""))
	require.Error(t, err)
	require.Equal(t, "funded", f.state(t, w.ID))

	n, err := f.svc.Reconcile(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "enqueued", f.state(t, w.ID))
	n, err = f.svc.Reconcile(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "reconciling twice enqueues once")
	require.EqualValues(t, 3, f.spent(t), "one debit")
}

func TestFundedIntentWhosePoolIsGoneIsRefundedAndWokenWithFailed(t *testing.T) {
	f := newFixture(t)
	f.crash = true
	w, err := f.svc.Create(context.Background(), params("doomed"))
	require.Error(t, err)
	_, err = f.db.Exec(context.Background(), `DELETE FROM workpool_pools WHERE name = 'doomed'`)
	require.NoError(t, err)

	n, err := f.svc.Reconcile(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, err := f.svc.Get(context.Background(), "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeFailed, got.Outcome)
	require.Contains(t, got.Error, "could not be enqueued")
	require.Equal(t, DeliveryQueued, got.Delivery.State, "the workflow's signal is queued")
	require.Zero(t, f.spent(t), "the spend is refunded")
}

func TestCancelOfAFundedIntentRefundsAndQueuesCanceled(t *testing.T) {
	f := newFixture(t)
	f.crash = true
	w, _ := f.svc.Create(context.Background(), params(""))
	got, err := f.svc.Cancel(context.Background(), "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeCanceled, got.Outcome)
	require.Zero(t, f.spent(t))
	n, err := f.svc.Reconcile(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "a canceled intent is not enqueued")

	again, err := f.svc.Cancel(context.Background(), "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeCanceled, again.Outcome, "cancel of a settled wake-up is a no-op")
	require.Zero(t, f.spent(t), "and refunds nothing twice")
}

// The pool keeps no error of canceled work; the Wake still says why, as
// a cancel before the work was enqueued does.
func TestAWakeForCanceledWorkSaysWhy(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	w, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)
	hookCtx, _ := json.Marshal(hookContext{OrgID: "o", WakeupID: w.ID})
	require.NoError(t, pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		return f.svc.onWorkComplete(ctx, tx, workpool.Completion{WorkID: *w.WorkID, OrgID: "o", Outcome: workpool.OutcomeCanceled, Context: hookCtx})
	}))
	msg, err := queue.GetByKey(ctx, f.db, "o", Queue, w.ID.String())
	require.NoError(t, err)
	var wake Wake
	require.NoError(t, json.Unmarshal(msg.Payload, &wake))
	require.Equal(t, Wake{OrgID: "o", WakeupID: w.ID.String(), Outcome: "canceled", Error: "canceled after its work was enqueued"}, wake)
	got, err := f.svc.Get(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, "canceled after its work was enqueued", got.Error)
}

func TestTheHookResolvesOnceAndQueuesOneSignal(t *testing.T) {
	f := newFixture(t)
	w, err := f.svc.Create(context.Background(), params(""))
	require.NoError(t, err)
	ctx := context.Background()
	hookCtx, _ := json.Marshal(hookContext{OrgID: "o", WakeupID: w.ID})
	for _, outcome := range []workpool.Outcome{workpool.OutcomeSucceeded, workpool.OutcomeFailed} {
		err := pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
			return f.svc.onWorkComplete(ctx, tx, workpool.Completion{WorkID: *w.WorkID, OrgID: "o", Outcome: outcome,
				Result: json.RawMessage(`{"n":1}`), Context: hookCtx})
		})
		require.NoError(t, err)
	}
	got, err := f.svc.Get(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeSucceeded, got.Outcome, "the first outcome stands")
	msg, err := queue.GetByKey(ctx, f.db, "o", Queue, w.ID.String())
	require.NoError(t, err)
	var wake Wake
	require.NoError(t, json.Unmarshal(msg.Payload, &wake))
	require.Equal(t, Wake{OrgID: "o", WakeupID: w.ID.String(), Outcome: "succeeded", Result: json.RawMessage(`{"n": 1}`)}, wake)
	require.Equal(t, &queue.Signal{WorkflowID: "o/wf", Name: "wake"}, msg.Signal)

	t.Run("a context naming another org is refused", func(t *testing.T) {
		err := pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
			return f.svc.onWorkComplete(ctx, tx, workpool.Completion{OrgID: "intruder", Outcome: workpool.OutcomeSucceeded, Context: hookCtx})
		})
		require.Error(t, err)
	})
}

func TestIdempotencyKeyReturnsTheSameWakeup(t *testing.T) {
	f := newFixture(t)
	p := params("")
	p.IdempotencyKey = "k"
	first, err := f.svc.Create(context.Background(), p)
	require.NoError(t, err)
	again, err := f.svc.Create(context.Background(), p)
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID)
	require.EqualValues(t, 3, f.spent(t))

	p.Cost = 4
	_, err = f.svc.Create(context.Background(), p)
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)

	p.Cost, p.Scope = 3, "unfunded"
	p.IdempotencyKey = "k2"
	_, err = f.svc.Create(context.Background(), p)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, mandates.RefusalNoMandate, refused.Refusal)
	_, err = f.svc.Create(context.Background(), p)
	require.ErrorAs(t, err, &refused, "a replayed refusal is still a refusal")
}

// A retry of a refused wake-up request (the same idempotency key, its
// first answer no longer kept) finds the request as it stands: a request
// settled without approval is still a refusal, naming how it was settled,
// never a wake-up that will run; an approved one is the funded wake-up.
func TestARetryOfARefusedRequestFindsItAsItStands(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		settle  func(t *testing.T, f *fixture, r *RefusedError)
		refusal string // "": funded
	}{
		{"still pending", func(*testing.T, *fixture, *RefusedError) {}, "pending approval"},
		{"denied", func(t *testing.T, f *fixture, r *RefusedError) {
			_, err := f.mandates.Deny(ctx, "o", r.ApprovalID, "approver", "no")
			require.NoError(t, err)
		}, RefusalApprovalDenied},
		{"expired", func(t *testing.T, f *fixture, r *RefusedError) {
			_, err := f.db.Exec(ctx, `UPDATE mandate_approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, r.ApprovalID)
			require.NoError(t, err)
			_, err = f.mandates.Approve(ctx, "o", r.ApprovalID, "approver", "")
			require.ErrorIs(t, err, mandates.ErrAlreadyResolved, "an overdue request expires instead")
		}, RefusalApprovalExpired},
		{"canceled with its wake-up", func(t *testing.T, f *fixture, r *RefusedError) {
			_, err := f.svc.Cancel(ctx, "o", AnyAgent, r.Wakeup.ID)
			require.NoError(t, err)
		}, RefusalApprovalCanceled},
		{"approved", func(t *testing.T, f *fixture, r *RefusedError) {
			_, err := f.mandates.Approve(ctx, "o", r.ApprovalID, "approver", "")
			require.NoError(t, err)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := params("")
			p.Cost, p.IdempotencyKey = 50, "over-budget" // refused
			_, err := f.svc.Create(ctx, p)
			var first *RefusedError
			require.ErrorAs(t, err, &first)
			tc.settle(t, f, first)

			w, err := f.svc.Create(ctx, p)
			require.Equal(t, first.Wakeup.ID, w.ID, "the same wake-up")
			if tc.refusal == "" {
				require.NoError(t, err)
				require.NotNil(t, w.WorkID, "funded: its work is enqueued")
				return
			}
			var again *RefusedError
			require.ErrorAs(t, err, &again)
			require.Equal(t, tc.refusal, again.Refusal)
			require.Equal(t, first.ApprovalID, again.ApprovalID)
			require.Equal(t, tc.refusal != "pending approval", again.Settled())
			require.Equal(t, 1, f.wakeupCount(t), "nothing new written")
		})
	}
}

func TestAnotherOrgsWakeupIsAbsent(t *testing.T) {
	f := newFixture(t)
	w, err := f.svc.Create(context.Background(), params(""))
	require.NoError(t, err)
	_, err = f.svc.Get(context.Background(), "intruder", AnyAgent, w.ID)
	require.ErrorIs(t, err, apperr.ErrNotFound)
	_, err = f.svc.Cancel(context.Background(), "intruder", AnyAgent, w.ID)
	require.ErrorIs(t, err, apperr.ErrNotFound)
	_, err = f.svc.Redeliver(context.Background(), "intruder", AnyAgent, w.ID)
	require.ErrorIs(t, err, apperr.ErrNotFound)
	items, _, err := f.svc.List(context.Background(), "intruder", ListFilter{}, nil, 50)
	require.NoError(t, err)
	require.Empty(t, items)
}

// A lookup narrowed to one agent treats another agent's wake-up, and the
// work it enqueued, as absent: the same errors as an absent id.
func TestAnotherAgentsWakeupAndItsWorkAreAbsentToALookupNarrowedToAnAgent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	w, err := f.svc.Create(ctx, params("")) // agent "a"
	require.NoError(t, err)
	plain, err := f.pool.Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "wakeup", Handler: "echo"})
	require.NoError(t, err)

	_, err = f.svc.Get(ctx, "o", "b", w.ID)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.svc.Cancel(ctx, "o", "b", w.ID)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.svc.Redeliver(ctx, "o", "b", w.ID)
	require.ErrorIs(t, err, ErrNotFound)
	items, _, err := f.svc.List(ctx, "o", ListFilter{AgentID: "b"}, nil, 50)
	require.NoError(t, err)
	require.Empty(t, items)
	for name, id := range map[string]uuid.UUID{"another agent's": *w.WorkID, "plain": plain, "absent": uuid.Must(uuid.NewV7())} {
		_, err = f.svc.WorkStatus(ctx, "o", "b", id)
		require.ErrorIs(t, err, workpool.ErrNotFound, name)
	}
	_, err = f.svc.WorkStatus(ctx, "intruder", "a", *w.WorkID)
	require.ErrorIs(t, err, workpool.ErrNotFound, "another org's")
	require.Equal(t, "enqueued", f.state(t, w.ID), "the other agent's cancel did nothing")

	own, err := f.svc.Get(ctx, "o", "a", w.ID)
	require.NoError(t, err)
	require.Equal(t, w.ID, own.ID)
	st, err := f.svc.WorkStatus(ctx, "o", "a", *w.WorkID)
	require.NoError(t, err)
	require.Equal(t, *w.WorkID, st.ID)
	_, err = f.svc.WorkStatus(ctx, "o", AnyAgent, plain)
	require.NoError(t, err, "a caller bound to no agent sees plain work")
	got, err := f.svc.Cancel(ctx, "o", "a", w.ID)
	require.NoError(t, err)
	require.Equal(t, w.ID, got.ID)
}

func TestListRejectsBadFiltersNamingTheField(t *testing.T) {
	f := newFixture(t)
	for field, filter := range map[string]ListFilter{
		"agent_id":    {AgentID: "a\x00"},
		"workflow_id": {WorkflowID: "o/\xff"},
		"status":      {Status: "bogus"},
	} {
		_, _, err := f.svc.List(context.Background(), "o", filter, nil, 50)
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, field)
		require.Equal(t, field, inv.Fields[0].Field)
	}
}

func TestTextFieldsAreValidated(t *testing.T) {
	f := newFixture(t)
	cases := map[string]func(p *CreateParams){
		"workflow_id": func(p *CreateParams) { p.WorkflowID = "o/wf\x00" },
		"signal":      func(p *CreateParams) { p.Signal = string([]byte{0xff}) },
		"reason":      func(p *CreateParams) { p.Reason = strings.Repeat("r", maxText+1) },
		"agent_id":    func(p *CreateParams) { p.AgentID = "" },
	}
	for field, mutate := range cases {
		p := params("")
		mutate(&p)
		_, err := f.svc.Create(context.Background(), p)
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, field)
		require.Equal(t, field, inv.Fields[0].Field)
	}
	t.Run("a workflow id the org cannot own says why", func(t *testing.T) {
		for _, tc := range []struct{ org, id, detail string }{
			{"o", "o/", `needs a workflow name after "o/"`},
			{"o", "other/wf", `must start with "o/"`},
			// (it does start with "acme/eu/": the org holds the slash)
			{"acme/eu", "acme/eu/wf", `cannot name a workflow of org "acme/eu": an org id holding "/" owns no workflow`},
			{"acme/eu", "acme/eu/", `an org id holding "/" owns no workflow`},
		} {
			p := params("")
			p.OrgID, p.WorkflowID = tc.org, tc.id
			_, err := f.svc.Create(context.Background(), p)
			var inv *apperr.InvalidError
			require.ErrorAs(t, err, &inv, tc.id)
			require.Equal(t, "workflow_id", inv.Fields[0].Field, tc.id)
			require.Contains(t, inv.Fields[0].Detail, tc.detail, tc.id)
		}
	})
	require.Zero(t, f.spent(t))
}

func TestReplayWithDifferentWorkIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Work)
	}{
		{"other args", func(w *Work) { w.Args = json.RawMessage(`{"other":true}`) }},
		// (one value as float64: the args are compared exactly)
		{"args that differ past float64's precision", func(w *Work) { w.Args = json.RawMessage(`{"n":9007199254740992}`) }},
		{"another concurrency key", func(w *Work) { w.ConcurrencyKey = "k2" }},
		{"another key limit", func(w *Work) { w.KeyLimit = 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := params("")
			p.IdempotencyKey = "k"
			p.Work.ConcurrencyKey, p.Work.KeyLimit = "k1", 2
			p.Work.Args = json.RawMessage(`{"n":9007199254740993}`)
			_, err := f.svc.Create(context.Background(), p)
			require.NoError(t, err)
			tc.change(&p.Work)
			_, err = f.svc.Create(context.Background(), p)
			require.ErrorIs(t, err, ErrIdempotencyKeyReused)
		})
	}
}

// The work's concurrency key and limit reach the pool whichever way the
// work is enqueued: right after the gate, or by the reconciler from the
// stored intent.
func TestTheWorksConcurrencyKeyReachesThePool(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "after the gate", true: "by the reconciler"}[crash], func(t *testing.T) {
			f := newFixture(t)
			f.crash = crash
			p := params("")
			p.Work.ConcurrencyKey, p.Work.KeyLimit = "customer-7", 2
			w, _ := f.svc.Create(context.Background(), p)
			if crash {
				_, err := f.svc.Reconcile(context.Background())
				require.NoError(t, err)
			}
			var (
				key   string
				limit int
			)
			require.NoError(t, f.db.QueryRow(context.Background(), `
				SELECT w.concurrency_key, w.key_limit FROM wakeups u JOIN workpool_work w ON w.id = u.work_id AND w.org_id = u.org_id
				WHERE u.id = $1 AND u.org_id = 'o'`, w.ID).Scan(&key, &limit))
			require.Equal(t, "customer-7", key)
			require.Equal(t, 2, limit)
		})
	}
}

func TestApprovalOfWorkThatCanNoLongerRunRefundsAndFails(t *testing.T) {
	f := newFixture(t)
	p := params("doomed")
	p.Cost = 50 // over budget: refused
	_, err := f.svc.Create(context.Background(), p)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	_, err = f.db.Exec(context.Background(), `DELETE FROM workpool_pools WHERE name = 'doomed'`)
	require.NoError(t, err)

	a, err := f.mandates.Approve(context.Background(), "o", refused.ApprovalID, "approver", "")
	require.NoError(t, err, "the approval stands")
	require.Equal(t, mandates.StateApproved, a.State)
	got, err := f.svc.Get(context.Background(), "o", AnyAgent, refused.Wakeup.ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeFailed, got.Outcome)
	require.Equal(t, DeliveryQueued, got.Delivery.State)
	require.Zero(t, f.spent(t), "the approved overrun is refunded")
}

func (f *fixture) wakeupCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT count(*) FROM wakeups`).Scan(&n))
	return n
}

// An org at its cap of pending work in the pool is refused at the gate,
// before the spend: no money moves, no intent or approval request is left.
func TestAnOrgAtItsPendingCapIsRefusedBeforeAnythingIsSpent(t *testing.T) {
	f := newFixtureCapped(t, 2)
	for range 2 {
		_, err := f.svc.Create(context.Background(), params(""))
		require.NoError(t, err)
	}

	over := params("")
	over.Cost = 50 // would be refused by the mandate too: no approval request either
	for _, p := range []CreateParams{params(""), over} {
		_, err := f.svc.Create(context.Background(), p)
		require.ErrorIs(t, err, workpool.ErrTooManyPending)
	}

	require.EqualValues(t, 6, f.spent(t), "nothing spent for the refused ones")
	require.Equal(t, 2, f.wakeupCount(t), "no intent left behind")
	var approvals int
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT count(*) FROM mandate_approvals`).Scan(&approvals))
	require.Zero(t, approvals)
}

// Work already paid for is owed: a funded intent whose enqueue comes after
// the org reached its cap (the reconciler, an approval) is enqueued all
// the same, never left funded and debited without its wake-up.
func TestAFundedIntentIsEnqueuedEvenWhenItsOrgHasSinceReachedTheCap(t *testing.T) {
	f := newFixtureCapped(t, 1)
	f.crash = true
	stranded, err := f.svc.Create(context.Background(), params(""))
	require.Error(t, err)
	f.crash = false
	_, err = f.svc.Create(context.Background(), params(""))
	require.NoError(t, err, "the stranded intent's work is not enqueued yet")
	_, err = f.svc.Create(context.Background(), params(""))
	require.ErrorIs(t, err, workpool.ErrTooManyPending, "the org is at its cap now")

	n, err := f.svc.Reconcile(context.Background())

	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "enqueued", f.state(t, stranded.ID))
	require.EqualValues(t, 6, f.spent(t))
}

// A reconciler whose replica lost the leadership without noticing yet
// (another replica started a newer term) enqueues, refunds and signals
// nothing, whichever way the intent would settle; the current leader's
// round does.
func TestADeposedLeadersReconcileWritesNothing(t *testing.T) {
	tests := []struct {
		name    string
		pool    string
		gone    bool   // the pool is deleted: the intent is refunded instead
		settled string // the intent's state once the current leader reconciled it
	}{
		{name: "an intent whose work can be enqueued", settled: "enqueued"},
		{name: "an intent whose pool is gone", pool: "doomed", gone: true, settled: "resolved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			f.crash = true
			w, err := f.svc.Create(ctx, params(tt.pool))
			require.Error(t, err)
			if tt.gone {
				_, err = f.db.Exec(ctx, `DELETE FROM workpool_pools WHERE name = 'doomed'`)
				require.NoError(t, err)
			}
			deposed, err := leader.NewTerm(ctx, f.db, ReconcilerLeadership)
			require.NoError(t, err)
			current, err := leader.NewTerm(ctx, f.db, ReconcilerLeadership) // another replica took over
			require.NoError(t, err)

			n, err := f.svc.Reconcile(leader.WithTerm(ctx, deposed))
			require.ErrorIs(t, err, leader.ErrDeposed)
			require.Zero(t, n)
			require.Equal(t, "funded", f.state(t, w.ID))
			require.EqualValues(t, 3, f.spent(t), "not refunded")
			got, err := f.svc.Get(ctx, "o", AnyAgent, w.ID)
			require.NoError(t, err)
			require.Nil(t, got.WorkID, "no work enqueued")
			_, err = queue.GetByKey(ctx, f.db, "o", Queue, w.ID.String())
			require.ErrorIs(t, err, queue.ErrNotFound, "no signal queued")

			n, err = f.svc.Reconcile(leader.WithTerm(ctx, current))
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, tt.settled, f.state(t, w.ID))
		})
	}
}

func TestTheReconcilerRunsOnItsLeaderFromStartUntilStop(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.crash = true
	w, err := f.svc.Create(ctx, params(""))
	require.Error(t, err)
	require.NoError(t, f.svc.Stop(ctx), "stopping what never started is a no-op")

	require.NoError(t, f.svc.Start(ctx))
	err = f.svc.Start(ctx)
	require.ErrorIs(t, err, startstop.ErrStarted)
	require.EqualError(t, err, ReconcilerLeadership+": already started")
	require.Eventually(t, func() bool { return f.state(t, w.ID) == "enqueued" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, f.svc.Stop(ctx))
	require.NoError(t, f.svc.Stop(ctx), "stopping twice is safe")
}

// An undeliverable signal is queued again by a redelivery, and only once:
// a signal already queued is not undeliverable.
func TestARedeliveryQueuesAnUndeliverableSignalAgain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.crash = true // a funded intent, canceled: resolved, its signal queued
	w, err := f.svc.Create(ctx, params(""))
	require.Error(t, err)
	_, err = f.svc.Cancel(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, "resolved", f.state(t, w.ID))
	_, err = f.db.Exec(ctx, `UPDATE queue_messages SET status = 'failed', last_error = 'workflow not found' WHERE org_id = 'o' AND idempotency_key = $1`, w.ID.String())
	require.NoError(t, err)
	got, err := f.svc.Get(ctx, "o", AnyAgent, w.ID)
	require.NoError(t, err)
	require.Equal(t, DeliveryUndeliverable, got.Delivery.State)

	got, err = f.svc.Redeliver(ctx, "o", "a", w.ID)
	require.NoError(t, err)
	require.Equal(t, DeliveryQueued, got.Delivery.State)
	msg, err := queue.GetByKey(ctx, f.db, "o", Queue, w.ID.String())
	require.NoError(t, err)
	require.Equal(t, queue.StatusPending, msg.Status)

	again, err := f.svc.Redeliver(ctx, "o", "a", w.ID)
	require.ErrorIs(t, err, ErrNotUndeliverable)
	require.Equal(t, DeliveryQueued, again.Delivery.State, "the refusal shows the wake-up as it is")
}

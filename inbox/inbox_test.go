package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

func TestMain(m *testing.M) { testkit.Main(m) }

type fixture struct {
	db        *pgxpool.Pool
	log       *inbox.Log
	mandates  *mandates.Service
	approvals *approvals.Service
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	pool := testkit.NewPool(t)
	log := inbox.New(pool, inbox.Config{Logger: testkit.Logger(t)})
	return fixture{db: pool, log: log,
		mandates:  mandates.New(pool, mandates.Config{Logger: testkit.Logger(t), Inbox: log}),
		approvals: approvals.New(pool, approvals.Config{Logger: testkit.Logger(t), Inbox: log})}
}

func (f fixture) overrun(t *testing.T, org string) uuid.UUID {
	t.Helper()
	res, err := f.mandates.Spend(context.Background(), mandates.SpendParams{OrgID: org, AgentID: "agent-1", Scope: "llm", Cost: 1, RequestedBy: "runtime"})
	require.NoError(t, err)
	require.False(t, res.OK)
	return res.ApprovalID
}

func (f fixture) toolCall(t *testing.T, org, session string) uuid.UUID {
	t.Helper()
	res, err := f.approvals.Request(context.Background(), approvals.RequestParams{OrgID: org, SessionID: session, AgentID: "agent-1",
		ToolName: "send_email", RequestedBy: "runtime"})
	require.NoError(t, err)
	require.Equal(t, approvals.DecisionPending, res.Decision)
	return res.Approval.ID
}

// all reads every event of the org, page by page.
func (f fixture) all(t *testing.T, org string) []inbox.Event {
	t.Helper()
	var out []inbox.Event
	for {
		page, err := f.log.After(context.Background(), org, int64(len(out)), 7)
		require.NoError(t, err)
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
	}
}

func TestSeqIsGapFreeUnderConcurrentWritersOfOneOrg(t *testing.T) {
	f := newFixture(t)
	const writers, each = 20, 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := map[uuid.UUID]bool{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ids := []uuid.UUID{f.overrun(t, "org-a"), f.toolCall(t, "org-a", fmt.Sprintf("s%d", w))}
				mu.Lock()
				for _, id := range ids {
					created[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	f.overrun(t, "org-b") // another org's seq is its own
	wg.Wait()

	events := f.all(t, "org-a")
	require.Len(t, events, writers*each*2)
	for i, ev := range events {
		require.EqualValues(t, i+1, ev.Seq, "seq 1, 2, 3 … without gaps")
		require.Equal(t, inbox.TypeRequested, ev.Type)
		require.True(t, created[ev.ApprovalID], "event %d is about an approval made here", ev.Seq)
		delete(created, ev.ApprovalID)
	}
	require.Empty(t, created, "every approval has its event")
	seq, err := f.log.Seq(context.Background(), f.db, "org-a")
	require.NoError(t, err)
	require.EqualValues(t, writers*each*2, seq)
	other := f.all(t, "org-b")
	require.Len(t, other, 1)
	require.EqualValues(t, 1, other[0].Seq)
}

func TestExpiryOfEitherKindAppendsAResolvedEvent(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		create func(f fixture, t *testing.T) uuid.UUID
		table  string
		sweep  func(f fixture) (int, error)
		field  string
	}{
		{"mandate overrun", func(f fixture, t *testing.T) uuid.UUID { return f.overrun(t, "org-a") }, "mandate_approvals",
			func(f fixture) (int, error) { return f.mandates.Sweep(ctx) }, "state"},
		{"tool call", func(f fixture, t *testing.T) uuid.UUID { return f.toolCall(t, "org-a", "s") }, "tool_approvals",
			func(f fixture) (int, error) { return f.approvals.Sweep(ctx) }, "status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			id := tt.create(f, t)
			_, err := f.db.Exec(ctx, `UPDATE `+tt.table+` SET expires_at = now() - interval '1 second' WHERE id = $1`, id)
			require.NoError(t, err)
			n, err := tt.sweep(f)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			events := f.all(t, "org-a")
			require.Len(t, events, 2)
			require.Equal(t, inbox.TypeResolved, events[1].Type)
			require.Equal(t, id, events[1].ApprovalID)
			var approval map[string]any
			require.NoError(t, json.Unmarshal(events[1].Approval, &approval))
			require.Equal(t, "expired", approval[tt.field])
		})
	}
}

func TestAPolicyDecisionMakesNoEvent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.approvals.PutPolicy(ctx, "org-a", approvals.PolicyParams{AgentID: "agent-1", ToolName: "send_email", Approval: approvals.PolicyAlways, UpdatedBy: "root"})
	require.NoError(t, err)
	res, err := f.approvals.Request(ctx, approvals.RequestParams{OrgID: "org-a", SessionID: "s", AgentID: "agent-1", ToolName: "send_email", RequestedBy: "runtime"})
	require.NoError(t, err)
	require.Equal(t, approvals.DecisionApproved, res.Decision)
	require.Empty(t, f.all(t, "org-a"))
}

// OnAppend runs in the transaction of the change: its failure undoes the
// change, so a hook's writes (a webhook delivery) and the event stand or
// fall together.
func TestAFailingOnAppendRollsTheStateChangeBack(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	boom := errors.New("boom")
	f.log.OnAppend = func(context.Context, db.Querier, inbox.Event) error { return boom }
	_, err := f.mandates.Spend(ctx, mandates.SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: 1})
	require.ErrorIs(t, err, boom)
	_, err = f.approvals.Request(ctx, approvals.RequestParams{OrgID: "org-a", SessionID: "s", AgentID: "agent-1", ToolName: "t", RequestedBy: "r"})
	require.ErrorIs(t, err, boom)
	var n int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM mandate_approvals) + (SELECT count(*) FROM tool_approvals) + (SELECT count(*) FROM approval_events)`).Scan(&n))
	require.Zero(t, n, "nothing committed")

	var seen []int64
	f.log.OnAppend = func(_ context.Context, q db.Querier, ev inbox.Event) error {
		var inTx bool // the event is visible to the hook's own queries: same transaction
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM approval_events WHERE org_id = $1 AND seq = $2)`, ev.OrgID, ev.Seq).Scan(&inTx); err != nil {
			return err
		}
		if !inTx {
			return errors.New("hook does not see its event")
		}
		seen = append(seen, ev.Seq)
		return nil
	}
	f.overrun(t, "org-a")
	require.Equal(t, []int64{1}, seen, "the counter restarts where the rolled-back appends left it")
}

// AppendAll appends events in the order given, under consecutive seqs, and
// appends none when one of them has no approval object.
func TestAppendAllAppendsInOrderOrNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ev := func(body string) inbox.Event {
		return inbox.Event{OrgID: "org-a", Type: inbox.TypeRequested, Kind: inbox.KindMandateOverrun, ApprovalID: uuid.New(), Approval: []byte(body)}
	}
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	_, err = f.log.AppendAll(ctx, tx, []inbox.Event{ev(`{"n":1}`), ev("")})
	require.ErrorContains(t, err, "no approval object")
	got, err := f.log.AppendAll(ctx, tx, []inbox.Event{ev(`{"n":1}`), ev(`{"n":2}`), ev(`{"n":3}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	stored := f.all(t, "org-a")
	require.Len(t, stored, 3, "the refused call appended nothing")
	for i, e := range got {
		require.Equal(t, int64(i+1), e.Seq)
		require.Equal(t, stored[i].ApprovalID, e.ApprovalID)
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(stored[i].Approval))
	}
}

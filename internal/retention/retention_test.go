package retention

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/wakeup"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Ages rows are written with, against the default retentions: a week for
// settled rows, a day for idempotency windows.
const (
	old    = 8 * 24 * time.Hour // past every default retention
	recent = time.Hour          // inside every one
	day    = 24 * time.Hour
)

// rows writes the rows under test straight into their tables, each with
// the age given (how long ago it was written or settled).
type rows struct {
	t   *testing.T
	db  *pgxpool.Pool
	org string
}

func (r rows) exec(sql string, args ...any) {
	r.t.Helper()
	_, err := r.db.Exec(context.Background(), sql, args...)
	require.NoError(r.t, err)
}

func ago(d time.Duration) string { return fmt.Sprintf("%d seconds", int64(d.Seconds())) }

func (r rows) idempotencyKey(key string, age time.Duration) {
	r.exec(`INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at)
		VALUES ($1, 'POST /v1/things', $2, '\x00', now() - $3::interval)`, r.org, key, ago(age))
}

func (r rows) spendKey(key string, approvalID uuid.UUID, age time.Duration) {
	r.exec(`INSERT INTO mandate_spends (org_id, idempotency_key, agent_id, scope, cost, ledger_id, approval_id, created_at)
		VALUES ($1, $2, 'a1', 's', 1, $3, $4, now() - $5::interval)`, r.org, key, uuid.New(), approvalID, ago(age))
}

// mandateApproval writes a request; state pending ignores age.
func (r rows) mandateApproval(id uuid.UUID, state string, age time.Duration) {
	r.exec(`INSERT INTO mandate_approvals (id, org_id, agent_id, scope, cost, state, expires_at, created_at, resolved_at)
		VALUES ($1, $2, 'a1', 's', 1, $3, now() + interval '1 day', now() - $4::interval,
		        CASE WHEN $3 <> 'pending' THEN now() - $4::interval END)`, id, r.org, state, ago(age))
}

// wakeup writes a wake-up in state (resolved: succeeded), last changed
// age ago, perhaps naming an approval request.
func (r rows) wakeup(id uuid.UUID, state string, age time.Duration, approvalID *uuid.UUID) {
	r.exec(`INSERT INTO wakeups (id, org_id, agent_id, workflow_id, signal, scope, cost, pool, work, state, outcome,
		                     approval_id, created_at, updated_at)
		VALUES ($1, $2, 'a1', $2 || '/wf', 'wake', 's', 1, 'wakeup', '{}', $3,
		        CASE WHEN $3 = 'resolved' THEN 'succeeded' END, $4, now() - $5::interval, now() - $5::interval)`,
		id, r.org, state, approvalID, ago(age))
}

// message writes a queue message in status, settled (or written) age ago.
func (r rows) message(queue, key, status string, age time.Duration) {
	r.exec(`INSERT INTO queue_messages (id, org_id, queue, idempotency_key, status, signal_workflow_id, signal_name,
		                            created_at, updated_at, delivered_at)
		VALUES ($1, $2, $3, $4, $5, $2 || '/wf', 'wake', now() - $6::interval, now() - $6::interval,
		        CASE WHEN $5 = 'delivered' THEN now() - $6::interval END)`, uuid.New(), r.org, queue, key, status, ago(age))
}

// toolApproval writes a tool call in session; status pending ignores age.
func (r rows) toolApproval(id uuid.UUID, session, status string, age time.Duration) {
	r.exec(`INSERT INTO approval_sessions (org_id, session_id, agent_id) VALUES ($1, $2, 'a1') ON CONFLICT DO NOTHING`, r.org, session)
	r.exec(`INSERT INTO tool_approvals (id, org_id, session_id, agent_id, tool_name, status, source, expires_at, created_at, resolved_at)
		VALUES ($1, $2, $3, 'a1', 'tool', $4, CASE WHEN $4 <> 'pending' THEN 'human' END, now() + interval '1 hour',
		        now() - $5::interval, CASE WHEN $4 <> 'pending' THEN now() - $5::interval END)`, id, r.org, session, status, ago(age))
}

func (r rows) sessionEvent(session string, seq int, age time.Duration) {
	r.exec(`INSERT INTO approval_sessions (org_id, session_id, agent_id) VALUES ($1, $2, 'a1') ON CONFLICT DO NOTHING`, r.org, session)
	r.exec(`INSERT INTO session_events (org_id, session_id, seq, name, payload, created_at)
		VALUES ($1, $2, $3, 'e', '{}', now() - $4::interval)`, r.org, session, seq, ago(age))
}

// count is how many rows of table match where (with args).
func count(t *testing.T, db *pgxpool.Pool, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE `+where, args...).Scan(&n))
	return n
}

func newPurger(t *testing.T, db *pgxpool.Pool, cfg Config) *Purger {
	t.Helper()
	cfg.Logger = testkit.Logger(t)
	p, err := New(db, cfg)
	require.NoError(t, err)
	return p
}

// Each case writes rows, runs one pass with the default retentions, and
// says which rows of which tables are left: what is settled and old goes,
// what a pending signal, a spend key's window, a standing wake-up or a
// pending tool call still needs stays.
func TestAPassPurgesOnlyWhatIsPastRetentionAndNoLongerNeeded(t *testing.T) {
	id := func(n int) uuid.UUID { return uuid.MustParse(fmt.Sprintf("00000000-0000-7000-8000-%012d", n)) }
	type left struct {
		table, where string
		args         []any
		n            int
	}
	tests := []struct {
		name  string
		write func(r rows)
		left  []left
	}{
		{
			name: "an idempotency record is kept for its window and purged after it",
			write: func(r rows) {
				r.idempotencyKey("in-window", day-time.Hour)
				r.idempotencyKey("past-window", day+time.Hour)
			},
			left: []left{{"idempotency_keys", "key = 'in-window'", nil, 1}, {"idempotency_keys", "key = 'past-window'", nil, 0}},
		},
		{
			name: "a spend key is kept for its window and purged after it",
			write: func(r rows) {
				r.mandateApproval(id(1), "pending", 0)
				r.spendKey("in-window", id(1), day-time.Hour)
				r.spendKey("past-window", id(1), day+time.Hour)
			},
			left: []left{{"mandate_spends", "idempotency_key = 'in-window'", nil, 1}, {"mandate_spends", "idempotency_key = 'past-window'", nil, 0}},
		},
		{
			name: "an old resolved approval request goes; a pending or recently resolved one stays",
			write: func(r rows) {
				r.mandateApproval(id(1), "denied", old)
				r.mandateApproval(id(2), "pending", old)
				r.mandateApproval(id(3), "approved", recent)
				r.mandateApproval(id(4), "expired", old)
			},
			left: []left{{"mandate_approvals", "id = ANY($1)", []any{[]uuid.UUID{id(1), id(4)}}, 0},
				{"mandate_approvals", "id = ANY($1)", []any{[]uuid.UUID{id(2), id(3)}}, 2}},
		},
		{
			name: "an old resolved approval request stays while a spend key in its window names it (its replay reads the refusal)",
			write: func(r rows) {
				r.mandateApproval(id(1), "denied", old)
				r.spendKey("k", id(1), day-time.Hour)
			},
			left: []left{{"mandate_approvals", "id = $1", []any{id(1)}, 1}, {"mandate_spends", "true", nil, 1}},
		},
		{
			name: "an old resolved approval request goes in the same pass as the spend key past its window that named it",
			write: func(r rows) {
				r.mandateApproval(id(1), "denied", old)
				r.spendKey("k", id(1), day+time.Hour)
			},
			left: []left{{"mandate_approvals", "true", nil, 0}, {"mandate_spends", "true", nil, 0}},
		},
		{
			name: "an old resolved approval request stays while a wake-up shows it",
			write: func(r rows) {
				r.mandateApproval(id(1), "denied", old)
				r.wakeup(id(2), "resolved", recent, ptr(id(1)))
				r.message("wakeup", id(2).String(), "delivered", recent)
			},
			left: []left{{"mandate_approvals", "true", nil, 1}, {"wakeups", "true", nil, 1}},
		},
		{
			name: "an old resolved wake-up goes with its delivered signal, and then its approval request",
			write: func(r rows) {
				r.mandateApproval(id(1), "approved", old)
				r.wakeup(id(2), "resolved", old, ptr(id(1)))
				r.message("wakeup", id(2).String(), "delivered", old)
			},
			left: []left{{"wakeups", "true", nil, 0}, {"queue_messages", "true", nil, 0}, {"mandate_approvals", "true", nil, 0}},
		},
		{
			name: "an old resolved wake-up whose signal is undeliverable goes with it",
			write: func(r rows) {
				r.wakeup(id(2), "resolved", old, nil)
				r.message("wakeup", id(2).String(), "failed", old)
			},
			left: []left{{"wakeups", "true", nil, 0}, {"queue_messages", "true", nil, 0}},
		},
		{
			name: "a wake-up whose signal is still pending keeps it, however old both are",
			write: func(r rows) {
				r.wakeup(id(2), "resolved", old, nil)
				r.message("wakeup", id(2).String(), "pending", old)
			},
			left: []left{{"wakeups", "true", nil, 1}, {"queue_messages", "true", nil, 1}},
		},
		{
			name: "an open wake-up stays, however old",
			write: func(r rows) {
				r.mandateApproval(id(1), "denied", old)
				r.wakeup(id(2), "enqueued", old, nil)
				r.wakeup(id(3), "awaiting_approval", old, ptr(id(1)))
				r.wakeup(id(4), "funded", old, nil)
			},
			left: []left{{"wakeups", "true", nil, 3}, {"mandate_approvals", "true", nil, 1}},
		},
		{
			name: "a resolved wake-up inside its retention stays, and its delivered signal with it",
			write: func(r rows) {
				r.wakeup(id(2), "resolved", recent, nil)
				r.message("wakeup", id(2).String(), "delivered", old) // settled long ago, shown by the wake-up
			},
			left: []left{{"wakeups", "true", nil, 1}, {"queue_messages", "true", nil, 1}},
		},
		{
			name: "a signal delivered recently keeps its old wake-up",
			write: func(r rows) {
				r.wakeup(id(2), "resolved", old, nil)
				r.message("wakeup", id(2).String(), "delivered", recent)
			},
			left: []left{{"wakeups", "true", nil, 1}, {"queue_messages", "true", nil, 1}},
		},
		{
			name: "an old settled message of no standing row goes; a pending or recent one stays",
			write: func(r rows) {
				r.message("other", "delivered-old", "delivered", old)
				r.message("other", "failed-old", "failed", old)
				r.message("other", "pending-old", "pending", old)
				r.message("other", "delivered-recent", "delivered", recent)
				r.message("wakeup", "not-a-uuid", "delivered", old)
			},
			left: []left{{"queue_messages", "idempotency_key = ANY($1)", []any{[]string{"pending-old", "delivered-recent"}}, 2},
				{"queue_messages", "true", nil, 2}},
		},
		{
			name: "an old decided tool call goes with its delivered signal; a pending one or one whose signal is pending stays",
			write: func(r rows) {
				r.toolApproval(id(1), "s1", "denied", old)
				r.message("tool_approval", id(1).String(), "delivered", old)
				r.toolApproval(id(2), "s1", "approved", old)
				r.message("tool_approval", id(2).String(), "pending", old)
				r.toolApproval(id(3), "s2", "pending", old)
				r.toolApproval(id(4), "s2", "expired", recent)
				r.toolApproval(id(5), "s2", "approved", old) // named no workflow: no signal
			},
			left: []left{{"tool_approvals", "id = ANY($1)", []any{[]uuid.UUID{id(2), id(3), id(4)}}, 3},
				{"tool_approvals", "true", nil, 3}, {"queue_messages", "true", nil, 1}},
		},
		{
			name: "rows written long ago but settled recently stay: retention counts from the settling",
			write: func(r rows) {
				r.mandateApproval(id(1), "approved", recent)
				r.toolApproval(id(2), "s1", "denied", recent)
				r.message("other", "redelivered", "delivered", recent)
				r.exec(`UPDATE mandate_approvals SET created_at = now() - interval '30 days'`)
				r.exec(`UPDATE tool_approvals SET created_at = now() - interval '30 days'`)
				r.exec(`UPDATE queue_messages SET created_at = now() - interval '30 days'`)
			},
			left: []left{{"mandate_approvals", "true", nil, 1}, {"tool_approvals", "true", nil, 1}, {"queue_messages", "true", nil, 1}},
		},
		{
			name: "old session events go unless their session has a call pending; their sessions stay",
			write: func(r rows) {
				r.sessionEvent("idle", 1, old)
				r.sessionEvent("idle", 2, recent)
				r.sessionEvent("waiting", 1, old)
				r.toolApproval(id(1), "waiting", "pending", recent)
			},
			left: []left{{"session_events", "session_id = 'idle'", nil, 1}, {"session_events", "session_id = 'idle' AND seq = 2", nil, 1},
				{"session_events", "session_id = 'waiting'", nil, 1}, {"approval_sessions", "true", nil, 2}},
		},
		{
			name: "old approvals inbox events go; recent ones and the per-org counters stay",
			write: func(r rows) {
				for seq, age := range []time.Duration{old, old, recent} {
					r.exec(`INSERT INTO approval_events (org_id, seq, type, kind, approval_id, payload, created_at)
						VALUES ($1, $2, 'requested', 'tool_call', gen_random_uuid(), '{}', now() - $3::interval)`, r.org, seq+1, ago(age))
				}
				r.exec(`INSERT INTO approval_event_counters (org_id, seq) VALUES ($1, 3)`, r.org)
			},
			left: []left{{"approval_events", "seq = 3", nil, 1}, {"approval_events", "true", nil, 1},
				{"approval_event_counters", "seq = 3", nil, 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := testkit.NewPool(t)
			tt.write(rows{t: t, db: db, org: "org-a"})
			_, err := newPurger(t, db, Config{}).Pass(context.Background())
			require.NoError(t, err)
			for _, l := range tt.left {
				require.Equal(t, l.n, count(t, db, l.table, l.where, l.args...), "%s where %s", l.table, l.where)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Another org's rows are purged or kept by their own age and needs, never
// by a namesake's: a wake-up of org-b does not keep org-a's message with
// the same key, and org-a's pending call does not keep org-b's events.
func TestAPurgeJudgesEachRowByItsOwnOrgsRows(t *testing.T) {
	db := testkit.NewPool(t)
	a, b := rows{t: t, db: db, org: "org-a"}, rows{t: t, db: db, org: "org-b"}
	w, appr := uuid.New(), uuid.New()
	b.wakeup(w, "resolved", recent, &appr)
	a.message("wakeup", w.String(), "delivered", old)
	a.mandateApproval(appr, "denied", old)
	b.message("wakeup", w.String(), "delivered", old)
	a.toolApproval(uuid.New(), "s", "pending", recent)
	b.sessionEvent("s", 1, old)
	a.sessionEvent("s", 1, old)

	_, err := newPurger(t, db, Config{}).Pass(context.Background())
	require.NoError(t, err)

	require.Zero(t, count(t, db, "queue_messages", "org_id = 'org-a'"), "org-b's wake-up does not keep org-a's message")
	require.Equal(t, 1, count(t, db, "queue_messages", "org_id = 'org-b'"), "its own does")
	require.Zero(t, count(t, db, "mandate_approvals", "true"), "org-b's wake-up does not keep org-a's request")
	require.Zero(t, count(t, db, "session_events", "org_id = 'org-b'"), "org-a's pending call does not keep org-b's events")
	require.Equal(t, 1, count(t, db, "session_events", "org_id = 'org-a'"))
}

// deletes notes the rows each purge statement deleted.
type deletes struct {
	mu   sync.Mutex
	rows []int64
}

func (d *deletes) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (d *deletes) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil && strings.HasPrefix(data.CommandTag.String(), "DELETE") {
		d.mu.Lock()
		d.rows = append(d.rows, data.CommandTag.RowsAffected())
		d.mu.Unlock()
	}
}

func TestAPassDrainsABacklogLargerThanABatchInBoundedBatches(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	traced := &deletes{}
	cfg.ConnConfig.Tracer = traced
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	r := rows{t: t, db: db, org: "org-a"}
	r.exec(`INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at)
		SELECT 'org-a', 'POST /v1/things', 'old-' || i, '\x00', now() - interval '2 days' FROM generate_series(1, 25) i`)
	r.idempotencyKey("fresh", recent)
	p := newPurger(t, db, Config{Batch: 10})

	counts, err := p.Pass(context.Background())

	require.NoError(t, err)
	require.EqualValues(t, 25, counts["idempotency_keys"])
	require.Equal(t, []string{"fresh"}, keysLeft(t, db))
	var purged dto.Metric
	require.NoError(t, p.purged.WithLabelValues("idempotency_keys").Write(&purged))
	require.EqualValues(t, 25, purged.GetCounter().GetValue(), "reveille_retention_purged_total{table=idempotency_keys}")
	traced.mu.Lock()
	defer traced.mu.Unlock()
	require.Equal(t, []int64{10, 10, 5}, traced.rows[:3], "three statements of at most a batch each, the short one last")
}

func keysLeft(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rs, err := db.Query(context.Background(), `SELECT key FROM idempotency_keys ORDER BY key`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rs, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// A pass whose replica lost the leadership without noticing yet (another
// replica started a newer term) deletes nothing; the current leader's does.
func TestADeposedLeadersPassDeletesNothing(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	rows{t: t, db: db, org: "org-a"}.idempotencyKey("old", old)
	deposed, err := leader.NewTerm(ctx, db, Leadership)
	require.NoError(t, err)
	current, err := leader.NewTerm(ctx, db, Leadership) // another replica took over
	require.NoError(t, err)
	p := newPurger(t, db, Config{})

	_, err = p.Pass(leader.WithTerm(ctx, deposed))
	require.ErrorIs(t, err, leader.ErrDeposed)
	require.Equal(t, []string{"old"}, keysLeft(t, db))

	counts, err := p.Pass(leader.WithTerm(ctx, current))
	require.NoError(t, err)
	require.EqualValues(t, 1, counts["idempotency_keys"])
	require.Empty(t, keysLeft(t, db))
}

// Two replicas run the purge: one of them leads (one term was ever
// started) and purges at once what is past retention, and nothing else.
func TestThePurgeRunsOnOneLeaderForAllReplicas(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	r := rows{t: t, db: db, org: "org-a"}
	r.idempotencyKey("old", old)
	r.idempotencyKey("fresh", recent)
	replicas := []*Purger{newPurger(t, db, Config{}), newPurger(t, db, Config{})}
	for _, p := range replicas {
		require.NoError(t, p.Start(ctx))
	}
	require.Eventually(t, func() bool { k := keysLeft(t, db); return len(k) == 1 && k[0] == "fresh" }, 10*time.Second, 5*time.Millisecond)
	var terms int64
	require.NoError(t, db.QueryRow(ctx, `SELECT term FROM leader_terms WHERE name = $1`, Leadership).Scan(&terms))
	require.EqualValues(t, 1, terms, "one replica led")
	for _, p := range replicas {
		require.NoError(t, p.Stop(ctx))
	}
}

func TestRetentionsOfKeyedRowsAreNeverShorterThanTheIdempotencyWindow(t *testing.T) {
	cfg := Config{IdempotencyRecords: 48 * time.Hour, SpendKeys: time.Hour, Wakeups: time.Hour, ToolApprovals: time.Hour,
		MandateApprovals: time.Hour, QueueMessages: time.Hour, SessionEvents: time.Hour, ApprovalEvents: time.Hour}.WithDefaults()
	keep := map[string]time.Duration{}
	for _, tb := range cfg.Tables() {
		keep[tb.Name] = tb.Keep
	}
	require.Equal(t, map[string]time.Duration{
		"idempotency_keys": 48 * time.Hour, "mandate_spends": 48 * time.Hour, "wakeups": 48 * time.Hour, "tool_approvals": 48 * time.Hour,
		"mandate_approvals": time.Hour, "queue_messages": time.Hour, "session_events": time.Hour,
		"approval_events": time.Hour,
	}, keep)
}

// An operator redelivers an old wake-up's undeliverable signal while a
// pass runs: the pass leaves the wake-up to the redelivery, whose signal is
// queued again; a redelivery after the pass took the wake-up finds none.
func TestAWakeupIsNotPurgedUnderARedeliveryOfItsSignal(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	r := rows{t: t, db: db, org: "org-a"}
	w := uuid.New()
	r.wakeup(w, "resolved", old, nil)
	r.message("wakeup", w.String(), "failed", old)

	tx, err := db.Begin(ctx) // the redelivery, under way
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, wakeup.RedeliverTx(ctx, tx, "org-a", w))
	_, err = newPurger(t, db, Config{}).Pass(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, 1, count(t, db, "queue_messages", "status = 'pending'"), "the redelivered signal is queued")
	require.Equal(t, 1, count(t, db, "wakeups", "id = $1", w), "and its wake-up stays")

	gone := uuid.New()
	r.wakeup(gone, "resolved", old, nil)
	r.message("wakeup", gone.String(), "failed", old)
	_, err = newPurger(t, db, Config{}).Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, count(t, db, "wakeups", "id = $1", gone))
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return wakeup.RedeliverTx(ctx, tx, "org-a", gone) })
	require.ErrorIs(t, err, wakeup.ErrNotFound)
	require.Equal(t, 1, count(t, db, "queue_messages", "status = 'pending'"), "no signal for a purged wake-up is queued")
}

// An Idempotency-Key's answer is replayed for the window from when it was
// recorded, and a record still in flight belongs to its running request:
// the purge counted the window from the claim, deleting both (a duplicate
// then ran the handler again).
func TestAnIdempotencyRecordIsPurgedByItsAnswersAgeNotItsClaims(t *testing.T) {
	db := testkit.NewPool(t)
	r := rows{t: t, db: db, org: "org-a"}
	for _, k := range []struct{ key, completed string }{
		{"running", "NULL"},
		{"answered-now", "now()"},
		{"answered-long-ago", "now() - interval '5 seconds'"},
	} {
		r.exec(`INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at, completed_at)
			VALUES ('org-a', 'POST /v1/things', $1, '\x00', now() - interval '10 seconds', `+k.completed+`)`, k.key)
	}
	r.exec(`INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at)
		VALUES ('org-a', 'POST /v1/things', 'abandoned', '\x00', now() - interval '2 hours')`)
	p := newPurger(t, db, Config{IdempotencyRecords: time.Second})

	_, err := p.Pass(context.Background())

	require.NoError(t, err)
	require.Equal(t, []string{"answered-now", "running"}, keysLeft(t, db))
}

package workpool

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// The loop's statements run on a table that holds every item a pool ever
// had until retention purges it: a statement whose plan reads the whole
// table turns each iteration into a scan of it. Postgres plans them once
// and then reuses the generic plan, whose estimates know nothing of the
// parameters or of a subquery's value; an EXISTS or a probe bounded by one
// ("another org than the first", "any keyed work") then looks cheapest as a
// sequential scan expected to stop at its first row, which on a table of
// one org's backlog reads every row. Each statement here is planned
// generically on analyzed tables of one org's backlog and of 20 orgs', and
// must reach workpool_work through its indexes.
func TestTheLoopsStatementsNeverScanTheWholeWorkTable(t *testing.T) {
	for _, orgs := range []int{1, 20} {
		t.Run(fmt.Sprintf("%d orgs", orgs), func(t *testing.T) {
			ctx := context.Background()
			m, err := New(testkit.NewPool(t), Config{Pools: map[string]int{"default": 100}, Logger: testkit.Logger(t), MaxPendingPerOrg: 1_000_000})
			require.NoError(t, err)
			m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
			ps := make([]EnqueueParams, 20_000)
			for i := range ps {
				ps[i] = EnqueueParams{OrgID: fmt.Sprintf("org-%02d", i*orgs/len(ps)), Pool: "default", Handler: "noop", Args: json.RawMessage(`{}`)}
			}
			for i := 0; i < len(ps); i += 1000 {
				_, err := m.EnqueueMany(ctx, ps[i:i+1000])
				require.NoError(t, err)
			}
			// some run, some finished, as in any busy pool
			_, err = m.db.Exec(ctx, `UPDATE workpool_work SET state = 'running', started_at = now()
				WHERE id IN (SELECT id FROM workpool_work ORDER BY id LIMIT 50)`)
			require.NoError(t, err)
			_, err = m.db.Exec(ctx, `UPDATE workpool_work SET state = 'finished', started_at = now(), finished_at = now()
				WHERE id IN (SELECT id FROM workpool_work WHERE state = 'pending' ORDER BY id LIMIT 5000)`)
			require.NoError(t, err)
			_, err = m.db.Exec(ctx, `VACUUM ANALYZE workpool_work`)
			require.NoError(t, err)

			l := newLoop(m, "default")
			require.NoError(t, l.takeover(ctx))
			now := time.Now()
			start := append(l.startArgs(now), l.gen)
			fair := append(append([]any{}, start...), l.turns.args()...)
			for _, s := range []struct {
				name string
				sql  string
				args []any
			}{
				{"sqlIterateFast", sqlIterateFast, start},
				{"sqlIterateFastNear", sqlIterateFastNear, fair},
				{"sqlIterateFastShared", sqlIterateFastShared, fair},
				{"sqlCensus", sqlCensus, []any{l.pool, now}},
				{"sqlOutlook", sqlOutlook, []any{l.pool, now}},
				{"sqlStartPlain", sqlStartPlain, append(l.startArgs(now), int32(100))},
				{"sqlStartFair", sqlStartFair, append(append(l.startArgs(now), int32(100), (*int32)(nil)), l.turns.args()...)},
				{"sqlStartPlainBesideCancels", sqlStartPlainBesideCancels, append(l.startArgs(now), int32(100))},
				{"sqlStartFairBesideCancels", sqlStartFairBesideCancels, append(append(l.startArgs(now), int32(100), (*int32)(nil)), l.turns.args()...)},
				{"sqlStale", sqlStale, []any{l.pool, now}},
				{"sqlDueHooks", sqlDueHooks, []any{l.pool, now}},
			} {
				requireNoWorkTableScan(t, m.db, s.name, s.sql, s.args)
			}
			requireNoWorkTableScan(t, m.db, "sqlFairView", sqlFairView, []any{l.pool, now})
			if orgs > 1 {
				v, err := l.readView(ctx, now)
				require.NoError(t, err)
				require.NotNil(t, v)
				var orgs []string
				var heads []time.Time
				var ns []int32
				for org, o := range v.orgs {
					orgs, heads, ns = append(orgs, org), append(heads, o.head), append(ns, readAheadOf(8))
				}
				requireNoWorkTableScan(t, m.db, "sqlReadAhead", sqlReadAhead, []any{l.pool, orgs, heads, ns, now})
				p, err := v.readAhead(ctx, m.db, l.pool, now, &l.turns, time.Minute)
				require.NoError(t, err)
				args, _ := v.args(l, now, p)
				requireNoWorkTableScan(t, m.db, "sqlIterateFastPlanned", sqlIterateFastPlanned, args)
				var seen []string
				var moves []*time.Time // (one null: a queue that goes)
				orgs = orgs[:0]
				for org, o := range v.orgs {
					orgs, moves, seen = append(orgs, org), append(moves, &now), append(seen, o.seen)
				}
				moves[0] = nil
				requireNoWorkTableScan(t, m.db, "sqlMoveViewHeads", sqlMoveViewHeads, []any{l.pool, orgs, moves, seen})
			}
		})
	}
}

// The statements of requests (a pool's description, a work item's status,
// a cancel), of the executors and completers, and of the leader's chores
// run on the same table as the loop's: planned generically on an analyzed
// table of one org's backlog beside finished work (retention keeps it),
// keyed work and running work, each must reach workpool_work through its
// indexes. GET /v1/pools/{pool} read the whole table at every call: the
// count of what an org's keys hold back asked for state IN ('pending',
// 'running'), which neither partial index serves.
func TestTheRequestsAndChoresStatementsNeverScanTheWholeWorkTable(t *testing.T) {
	ctx := context.Background()
	m, err := New(testkit.NewPool(t), Config{Pools: map[string]int{"default": 100}, Logger: testkit.Logger(t), MaxPendingPerOrg: 1_000_000})
	require.NoError(t, err)
	_, err = m.db.Exec(ctx, `INSERT INTO workpool_pools (name, max_parallelism) VALUES ('default', 100) ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	// 30,000 items, four in five org-00's: 70% finished, 1 in 1000 running,
	// the rest pending, a seventh of it keyed
	_, err = m.db.Exec(ctx, `
INSERT INTO workpool_work (id, org_id, pool, handler, args, state, run_at, timeout_ms, concurrency_key, key_limit,
  started_at, finished_at, outcome, result, attempts, hook_state, on_complete_hook, created_at)
SELECT gen_random_uuid(), CASE WHEN i % 10 < 8 THEN 'org-00' ELSE 'org-' || lpad((1 + i % 19)::text, 2, '0') END,
  'default', 'noop', '{}', CASE WHEN i % 100 < 70 THEN 'finished' WHEN i % 1000 = 999 THEN 'running' ELSE 'pending' END,
  now() - interval '1 hour' + i * interval '1 ms', 600000,
  CASE WHEN i % 100 >= 70 AND i % 7 = 0 THEN 'key-' || (i % 50) END, CASE WHEN i % 100 >= 70 AND i % 7 = 0 THEN 1 END,
  CASE WHEN i % 100 < 70 OR i % 1000 = 999 THEN now() - interval '30 minutes' END,
  CASE WHEN i % 100 < 70 THEN now() - interval '20 minutes' + i * interval '1 ms' END,
  CASE WHEN i % 100 < 70 THEN (ARRAY['succeeded', 'failed', 'canceled'])[1 + i % 3] END,
  CASE WHEN i % 100 < 70 THEN '{}'::jsonb END, CASE WHEN i % 100 < 70 THEN 1 ELSE 0 END,
  CASE WHEN i % 100 < 70 THEN 'done' END, CASE WHEN i % 100 < 70 THEN 'h' END, now() - interval '2 hours'
FROM generate_series(1, 30000) i`)
	require.NoError(t, err)
	_, err = m.db.Exec(ctx, `VACUUM ANALYZE workpool_work`)
	require.NoError(t, err)
	_, err = m.db.Exec(ctx, `ANALYZE workpool_pools`)
	require.NoError(t, err)

	now := time.Now()
	ids := []string{uuid.NewString(), uuid.NewString()}
	exec := uuid.NewString()
	for _, s := range []struct {
		name string
		sql  string
		args []any
	}{
		{"sqlPoolInfo", sqlPoolInfo, []any{[]string{"default"}, "org-00", now}},
		{"sqlPoolInfo (a small org)", sqlPoolInfo, []any{[]string{"default"}, "org-05", now}},
		{"sqlStatus", sqlStatus, []any{ids[0], "org-00"}},
		{"sqlCancel", sqlCancel, []any{ids[0], "org-00", now}},
		{"sqlCancelAll", sqlCancelAll, []any{"org-05", "default", now, now}},
		{"sqlComplete", sqlComplete, []any{ids, []int32{1, 1}, []string{"succeeded", "failed"}, []*string{nil, nil},
			[]string{"", "x"}, []bool{false, true}, now, exec}},
		{"sqlCompleteUnstorable", sqlCompleteUnstorable, []any{ids, []int32{1, 1}, "x", now}},
		{"sqlClaim", sqlClaim, []any{exec, now, []string{"noop"}, int32(10)}},
		{"sqlHeartbeat", sqlHeartbeat, []any{ids, exec, now}},
		{"sqlReleaseOrphans", sqlReleaseOrphans, []any{exec, ids}},
		{"sqlMarkCanceled", sqlMarkCanceled, []any{ids}},
		{"sqlFinishCanceled", sqlFinishCanceled, []any{ids, now}},
		{"sqlHookFailed", sqlHookFailed, []any{ids, []time.Time{now, now}, []string{"x", "y"}}},
		{"sqlHookDone", sqlHookDone, []any{ids}},
		{"sqlCountPending", sqlCountPending, []any{"default", "org-00", int64(1_000_001)}},
		{"sqlRepairQueues", sqlRepairQueues, []any{"default"}},
	} {
		requireNoWorkTableScan(t, m.db, s.name, s.sql, s.args)
	}
}

// workpool_cancelations is empty nearly always, so the plan a connection
// caches for taking a batch of them (every full iteration) is one made for
// an empty table. Once a CancelAll of a backlog fills it, that plan must
// still take the batch reading the table no more than once for the batch
// and once for the delete: written as a join of the table with the batch,
// it read the batch again for every row of the table — 5 million rows
// compared, 1.5–3 s an iteration at 50,000 cancelations, until an ANALYZE
// saw the table.
func TestTakingCancelationsAfterACancelAllOfABacklogReadsTheTableOnce(t *testing.T) {
	ctx := context.Background()
	db := testkit.NewPool(t)
	_, err := db.Exec(ctx, `VACUUM ANALYZE workpool_cancelations`)
	require.NoError(t, err)
	args := []any{"default", int32(cancelationBatch)}
	plan := testkit.PlanAfterChange(t, db, sqlTakeCancelations, [][]any{args, args, args, args, args, args}, func() {
		_, err := db.Exec(ctx, `INSERT INTO workpool_cancelations (work_id, pool, org_id, created_at)
			SELECT gen_random_uuid(), 'default', 'org-00', now() + i * interval '1 ms' FROM generate_series(1, 50000) i`)
		require.NoError(t, err)
	}, args)
	for _, line := range plan {
		if m := loops.FindStringSubmatch(line); m != nil && m[1] != "1" {
			t.Fatalf("a node runs %s times:\n%s", m[1], strings.Join(plan, "\n"))
		}
	}
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM workpool_cancelations`).Scan(&left))
	require.Equal(t, 50000-cancelationBatch, left, "a batch taken")
}

// A start beside a full batch of cancelations passes over work whose
// cancelation waits, tested on the items the pick took: one org's CancelAll
// of 20,000 ready items leaves the plain start reading its free slots'
// worth of them, not the backlog to find one that is not being canceled.
func TestAStartBesideACancelAllOfAReadyBacklogReadsOnlyWhatItPicked(t *testing.T) {
	ctx := context.Background()
	db, m, l := leadingLoop(t)
	ps := make([]EnqueueParams, 5_000)
	for i := range ps {
		ps[i] = EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"}
	}
	for range 4 {
		_, err := m.EnqueueMany(ctx, ps)
		require.NoError(t, err)
	}
	n, err := m.CancelAll(ctx, "org-1", "default", time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 20_000, n)
	_, err = db.Exec(ctx, `VACUUM ANALYZE workpool_work, workpool_cancelations`)
	require.NoError(t, err)
	args := append(l.startArgs(time.Now()), int32(100))
	plan := testkit.PlanAfter(t, db, sqlStartPlainBesideCancels, [][]any{args, args, args, args, args}, args)
	text := strings.Join(plan, "\n")
	require.Less(t, testkit.BuffersTouched(plan), 1000, "the start read the backlog:\n%s", text)
	require.NotContains(t, text, "Seq Scan on workpool_cancelations", "the start read every cancelation waiting")
	require.Contains(t, text, "using workpool_cancelations_pkey", "each picked item is probed")
	require.Regexp(t, `Subquery Scan on p \(actual time=\S+ rows=0 `, text, "none of the backlog is started")
}

var loops = regexp.MustCompile(`loops=(\d+)\)`)

// A pool that holds a week of scheduled work (run_at in the future) has
// nothing ready: asking "which org has ready work" of the pending index
// (pool, org_id, run_at) walked every entry, 8 ms an iteration at 100,000
// items and more with each one scheduled — and every enqueue kicks an
// iteration. The census and the plain start read the orgs' queues and one
// org's range up to now instead: a few pages, however long the schedule.
// Keyed work, which the queues do not hold, is asked of its own index in
// run_at order (migration 00026), not walked through (pool, org_id,
// concurrency_key, run_at) the same way.
func TestAPoolsScheduledBacklogIsNotReadAtEveryIteration(t *testing.T) {
	for _, key := range []string{"", "k"} {
		t.Run("key "+strconv.Quote(key), func(t *testing.T) {
			ctx := context.Background()
			db, m, l := leadingLoop(t)
			for _, org := range []string{"org-1", "org-2", "org-3"} {
				ps := make([]EnqueueParams, 20_000)
				for i := range ps {
					ps[i] = EnqueueParams{OrgID: org, Pool: "default", Handler: "noop", ConcurrencyKey: key,
						RunAt: time.Now().Add(24*time.Hour + time.Duration(i)*time.Second)}
				}
				for i := 0; i < len(ps); i += 5000 {
					_, err := m.EnqueueMany(ctx, ps[i:i+5000])
					require.NoError(t, err)
				}
			}
			_, err := db.Exec(ctx, `VACUUM ANALYZE workpool_work`)
			require.NoError(t, err)
			now := time.Now()
			for _, s := range []struct {
				name string
				sql  string
				args []any
			}{
				{"sqlCensus", sqlCensus, []any{l.pool, now}},
				{"sqlStartPlain", sqlStartPlain, append(l.startArgs(now), int32(100))},
				{"sqlStartPlainBesideCancels", sqlStartPlainBesideCancels, append(l.startArgs(now), int32(100))},
			} {
				plan := testkit.PlanAfter(t, db, s.sql, [][]any{s.args, s.args, s.args, s.args, s.args}, s.args)
				require.Less(t, testkit.BuffersTouched(plan), 50, "%s reads the schedule:\n%s", s.name, strings.Join(plan, "\n"))
			}
		})
	}
}

// requireNoWorkTableScan fails t when the generic plan of sql (named name)
// reads workpool_work whole.
func requireNoWorkTableScan(t *testing.T, db *pgxpool.Pool, name, sql string, args []any) {
	t.Helper()
	plan := testkit.GenericPlan(t, db, sql, args)
	for i, line := range plan {
		if strings.Contains(line, "Seq Scan on workpool_work ") {
			t.Errorf("%s reads the whole table:\n%s\n%s", name, line, plan[min(i+1, len(plan)-1)])
		}
	}
}

// leadingLoop is a fresh database's manager (pool default, 100 slots, a
// pending cap out of reach, handler noop) and its pool's loop, taken over:
// for reading the loop's statements' plans.
func leadingLoop(t *testing.T) (*pgxpool.Pool, *Manager, *loop) {
	t.Helper()
	db := testkit.NewPool(t)
	m, err := New(db, Config{Pools: map[string]int{"default": 100}, Logger: testkit.Logger(t), MaxPendingPerOrg: 1_000_000})
	require.NoError(t, err)
	m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	l := newLoop(m, "default")
	require.NoError(t, l.takeover(context.Background()))
	return db, m, l
}

package wakeup

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// A page's cursor is a bound of the index range, never an OR
// (docs/conventions.md): after a pooled connection served five lists of one
// workflow's wake-ups (a parameter: the same statement, then its generic
// plan), a page of GET /v1/wakeups deep in an org's list reads a page, not
// every wake-up newer than its cursor.
func TestPagingWakeupsDeepReadsAPage(t *testing.T) {
	ctx := context.Background()
	trace := &testkit.LastQuery{}
	db := testkit.NewTracedPool(t, trace)
	wp, err := workpool.New(db, workpool.Config{Pools: map[string]int{"wakeup": 5}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	svc := New(db, wp, mandates.New(db, mandates.Config{Logger: testkit.Logger(t)}), Config{Logger: testkit.Logger(t)})
	_, err = db.Exec(ctx, `
		INSERT INTO wakeups (id, org_id, agent_id, workflow_id, signal, scope, cost, pool, work, state, outcome)
		SELECT gen_random_uuid(), CASE WHEN i % 10 <> 0 THEN 'org-00' ELSE 'org-' || lpad((i % 19 + 1)::text, 2, '0') END,
		       'agent', 'wf-' || (i % 1000), 'wake', 's', 1, 'wakeup', '{}', 'resolved', 'succeeded'
		  FROM generate_series(1, 60000) i`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `
		INSERT INTO queue_messages (id, org_id, queue, payload, idempotency_key, status, signal_workflow_id, signal_name, attempts, delivered_at)
		SELECT gen_random_uuid(), w.org_id, '`+Queue+`', '{}', w.id::text, 'delivered', w.workflow_id, w.signal, 1, now() FROM wakeups w`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE wakeups, queue_messages`)
	require.NoError(t, err)

	var warm [][]any
	var sql string
	for i := range 5 {
		_, _, err := svc.List(ctx, "org-00", ListFilter{WorkflowID: fmt.Sprintf("wf-%d", i+1)}, nil, 50)
		require.NoError(t, err)
		var args []any
		sql, args = trace.Last()
		warm = append(warm, args)
	}
	var deep uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM wakeups WHERE org_id = 'org-00' ORDER BY id DESC OFFSET 50000 LIMIT 1`).Scan(&deep))
	_, _, err = svc.List(ctx, "org-00", ListFilter{}, &deep, 50)
	require.NoError(t, err)
	last, probe := trace.Last()
	require.Equal(t, sql, last)
	testkit.RequireReadsAPage(t, "List", testkit.PlanAfter(t, db, sql, warm, probe), 1000)
}

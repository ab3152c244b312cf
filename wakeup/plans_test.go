package wakeup

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// Wake-ups are kept (with their delivered signals) for a week after they
// resolve, so an org's table is mostly resolved, delivered rows; the
// wake-ups an admin or a platform asks for by status — pending (waiting or
// queued), failed (undeliverable: what to redeliver) — are few. Listing
// them must read those few, not every wake-up of the org: the filters are
// on the signal's message, joined to each wake-up in turn, so the list
// walked the org's whole table (the custom plan a parallel scan of both
// tables, and past five calls on a connection the generic plan, which
// takes the org for an average one, a nested loop over all its rows).
func TestListingWakeupsByDeliveryStateReadsTheOpenRowsNotTheOrgsTable(t *testing.T) {
	ctx := context.Background()
	trace := &testkit.LastQuery{}
	db := testkit.NewTracedPool(t, trace)
	wp, err := workpool.New(db, workpool.Config{Pools: map[string]int{"wakeup": 5}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	svc := New(db, wp, mandates.New(db, mandates.Config{Logger: testkit.Logger(t)}), Config{Logger: testkit.Logger(t)})

	// 60,000 wake-ups of 20 orgs, 90 % of them org-00's; nearly all
	// resolved and their signals delivered; a few of each open kind.
	_, err = db.Exec(ctx, `
		INSERT INTO wakeups (id, org_id, agent_id, workflow_id, signal, scope, cost, pool, work, state, outcome)
		SELECT gen_random_uuid(), CASE WHEN i % 10 <> 0 THEN 'org-00' ELSE 'org-' || lpad((i % 19 + 1)::text, 2, '0') END,
		       'agent', 'wf-' || i, 'wake', 's', 1, 'wakeup', '{}',
		       CASE WHEN i % 2000 = 1 THEN 'enqueued' ELSE 'resolved' END, CASE WHEN i % 2000 = 1 THEN NULL ELSE 'succeeded' END
		  FROM generate_series(1, 60000) i`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `
		INSERT INTO queue_messages (id, org_id, queue, payload, idempotency_key, status, signal_workflow_id, signal_name, attempts,
		                            last_error, delivered_at)
		SELECT gen_random_uuid(), w.org_id, '`+Queue+`', '{}', w.id::text, s.status, w.workflow_id, w.signal, 1,
		       CASE WHEN s.status = 'failed' THEN 'gone' END, CASE WHEN s.status = 'delivered' THEN now() END
		  FROM (SELECT w.*, row_number() OVER (ORDER BY w.id) AS n FROM wakeups w WHERE w.state = 'resolved') w,
		       LATERAL (SELECT CASE WHEN w.n % 2000 = 2 THEN 'pending' WHEN w.n % 2000 = 3 THEN 'failed' ELSE 'delivered' END AS status) s`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE wakeups, queue_messages`)
	require.NoError(t, err)

	for _, f := range []ListFilter{
		{Status: StatusPending}, {Status: StatusFailed},
		{Delivery: DeliveryWaiting}, {Delivery: DeliveryQueued}, {Delivery: DeliveryUndeliverable},
	} {
		name := fmt.Sprintf("status=%s delivery=%s", f.Status, f.Delivery)
		items, _, err := svc.List(ctx, "org-00", f, nil, 50)
		require.NoError(t, err)
		require.NotEmpty(t, items, name)
		sql, args := trace.Last()
		require.Contains(t, sql, "ORDER BY", name)
		// an admin's page polled, as the list of what to redeliver is
		warm := [][]any{args, args, args, args, args}
		testkit.RequireReadsAPage(t, name, testkit.PlanAfter(t, db, sql, warm, args), 1000)
	}
}

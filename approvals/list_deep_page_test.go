package approvals

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A page's cursor is a bound of the index range, never an OR, which the
// generic plan a pooled connection reuses keeps as a filter over
// everything before the cursor (docs/conventions.md): after five filtered
// lists on a connection, a page of GET /v1/tool-approvals 50,000 rows deep
// reads a page, not the 50,000 rows newer than its cursor.
func TestPagingToolApprovalsDeepReadsAPage(t *testing.T) {
	ctx := context.Background()
	trace := &testkit.LastQuery{}
	db := testkit.NewTracedPool(t, trace)
	s := New(db, Config{Logger: testkit.Logger(t)})

	_, err := db.Exec(ctx, `
		INSERT INTO tool_approvals (id, org_id, session_id, agent_id, tool_name, status, source, resolved_at, expires_at)
		SELECT gen_random_uuid(), CASE WHEN i % 10 <> 0 THEN 'org-00' ELSE 'org-' || lpad((i % 19 + 1)::text, 2, '0') END,
		       's-' || (i % 1000), 'agent', 'tool', 'approved', 'human', now(), now()
		  FROM generate_series(1, 60000) i`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `
		INSERT INTO queue_messages (id, org_id, queue, payload, idempotency_key, status, signal_workflow_id, signal_name, attempts, delivered_at)
		SELECT gen_random_uuid(), a.org_id, '`+Queue+`', '{}', a.id::text, 'delivered', 'wf', 'sig', 1, now()
		  FROM tool_approvals a`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE tool_approvals, queue_messages`)
	require.NoError(t, err)

	// The same statement (same text: the filters are parameters) serves
	// an operator's inbox of one session, on the same pooled connection.
	var warm [][]any
	var sql string
	for i := range 5 {
		_, _, err := s.List(ctx, "org-00", ListFilter{SessionID: fmt.Sprintf("s-%d", i+1)}, Page{})
		require.NoError(t, err)
		var args []any
		sql, args = trace.Last()
		warm = append(warm, args)
	}
	// then a client pages the org's whole inbox
	_, next, err := s.List(ctx, "org-00", ListFilter{}, Page{})
	require.NoError(t, err)
	require.NotNil(t, next)
	last, probe := trace.Last()
	require.Equal(t, sql, last)
	var deep uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM tool_approvals WHERE org_id = 'org-00' ORDER BY id DESC OFFSET 50000 LIMIT 1`).Scan(&deep))
	probe[3] = &deep
	t.Logf("generic:\n%s", strings.Join(testkit.GenericPlan(t, db, sql, probe), "\n"))
	testkit.RequireReadsAPage(t, "List", testkit.PlanAfter(t, db, sql, warm, probe), 1000)
}

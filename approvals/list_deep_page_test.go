package approvals

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

type reviewLastQuery struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (l *reviewLastQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql, l.args = d.SQL, d.Args
	return ctx
}

func (l *reviewLastQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// docs/conventions.md: "a page's cursor is a bound of the index range
// (id > coalesce($3, '00000000-…')), never an OR ($3 IS NULL OR id > $3),
// which the generic plan keeps as a filter over everything before the
// cursor". List (GET /v1/tool-approvals) pages with `$4::uuid IS NULL OR
// a.id < $4`: a client paging an org's approvals deep on one connection
// reads every approval newer than its cursor.
func TestPagingToolApprovalsDeepReadsAPage(t *testing.T) {
	ctx := context.Background()
	trace := &reviewLastQuery{}
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
		trace.mu.Lock()
		sql = trace.sql
		warm = append(warm, trace.args)
		trace.mu.Unlock()
	}
	// then a client pages the org's whole inbox
	_, next, err := s.List(ctx, "org-00", ListFilter{}, Page{})
	require.NoError(t, err)
	require.NotNil(t, next)
	trace.mu.Lock()
	require.Equal(t, sql, trace.sql)
	probe := append([]any{}, trace.args...)
	trace.mu.Unlock()
	var deep uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM tool_approvals WHERE org_id = 'org-00' ORDER BY id DESC OFFSET 50000 LIMIT 1`).Scan(&deep))
	probe[3] = &deep
	t.Logf("generic:\n%s", strings.Join(testkit.GenericPlan(t, db, sql, probe), "\n"))
	testkit.RequireReadsAPage(t, "List", testkit.PlanAfter(t, db, sql, warm, probe), 1000)
}

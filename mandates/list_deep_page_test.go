package mandates

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A page's cursor is a bound of the index range, never an OR
// (docs/conventions.md): after a pooled connection served one agent's list
// five times (the agent filter is a parameter: the same statement, then its
// generic plan), a page of GET /v1/approvals deep in an org's list reads a
// page, not every row before its cursor.
func TestPagingApprovalRequestsDeepReadsAPage(t *testing.T) {
	ctx := context.Background()
	_, db := newTestService(t)
	_, err := db.Exec(ctx, `
		INSERT INTO mandate_approvals (id, org_id, agent_id, scope, cost, state, expires_at, resolved_at)
		SELECT gen_random_uuid(), CASE WHEN i % 10 <> 0 THEN 'org-00' ELSE 'org-' || lpad((i % 19 + 1)::text, 2, '0') END,
		       'agent-' || (i % 1000), 'llm', 1, 'denied', now() + interval '1 day', now()
		  FROM generate_series(1, 60000) i`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE mandate_approvals`)
	require.NoError(t, err)
	var deep uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM mandate_approvals WHERE org_id = 'org-00' ORDER BY id OFFSET 50000 LIMIT 1`).Scan(&deep))
	var warm [][]any
	for i := range 5 {
		warm = append(warm, []any{"org-00", "", fmt.Sprintf("agent-%d", i+1), nil, int32(51)})
	}
	plan := testkit.PlanAfter(t, db, qListApprovals, warm, []any{"org-00", "", "", &deep, int32(51)})
	testkit.RequireReadsAPage(t, "qListApprovals", plan, 1000)
}

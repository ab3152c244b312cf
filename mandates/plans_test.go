package mandates

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A mandate's ledger is never purged: every spend adds a row, so an
// agent's busy mandate holds hundreds of thousands. Paging it (GET
// /v1/mandates/{id}/ledger?cursor=…) must read a page, not every entry
// before the cursor. qLedger's cursor is an OR (`$3 IS NULL OR id > $3`):
// a custom plan folds it into the index condition, but once a connection
// has run the statement five times Postgres reuses the generic plan, in
// which the cursor is only a filter — every later page then walks the
// mandate's whole ledger up to the cursor.
func TestPagingALongLedgerReadsAPageNotTheLedgerBeforeIt(t *testing.T) {
	ctx := context.Background()
	s, db := newTestService(t)
	// 20 orgs' mandates; one mandate holds most of the ledger.
	var big Mandate
	for i := range 200 {
		m := mustCreate(t, s, fmt.Sprintf("org-%02d", i%20), fmt.Sprintf("agent-%d", i), "llm", 1<<40)
		if i == 0 {
			big = m
		}
	}
	_, err := db.Exec(ctx, `
		INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount, reason, created_at)
		SELECT gen_random_uuid(), m.org_id, m.id, 'debit', 1, 'x', now()
		  FROM generate_series(1, 60000) i
		  JOIN mandates m ON m.id = CASE WHEN i % 10 <> 0 THEN $1 ELSE (SELECT id FROM mandates ORDER BY id OFFSET (i / 10) % 200 LIMIT 1) END`,
		big.ID)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM ANALYZE mandate_ledger`)
	require.NoError(t, err)

	// A client pages through the big mandate's ledger on one connection:
	// five pages, then one deep in it.
	var cursors []*uuid.UUID
	var after *uuid.UUID
	for range 5 {
		cursors = append(cursors, after)
		pg := Page{}
		if after != nil {
			pg.Cursor = *after
		}
		_, next, err := s.Ledger(ctx, big.OrgID, AnyAgent, big.ID, pg)
		require.NoError(t, err)
		require.NotNil(t, next)
		after = next
	}
	var deep uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM mandate_ledger WHERE mandate_id = $1 ORDER BY id OFFSET 50000 LIMIT 1`,
		big.ID).Scan(&deep))
	var warm [][]any
	for _, c := range cursors {
		warm = append(warm, []any{big.OrgID, big.ID, c, int32(51)})
	}
	plan := testkit.PlanAfter(t, db, qLedger, warm, []any{big.OrgID, big.ID, &deep, int32(51)})
	testkit.RequireReadsAPage(t, "qLedger", plan, 1000)
}

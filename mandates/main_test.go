package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	testWait  = 10 * time.Second
	pollEvery = 5 * time.Millisecond
)

// newTestService returns a service on a fresh database.
func newTestService(t *testing.T, cfg ...Config) (*Service, *pgxpool.Pool) {
	t.Helper()
	db := testkit.NewPool(t)
	c := Config{Logger: testkit.Logger(t)}
	if len(cfg) > 0 {
		c = cfg[0]
		if c.Logger == nil {
			c.Logger = testkit.Logger(t)
		}
	}
	return New(db, c), db
}

func mustCreate(t *testing.T, s *Service, org, agent, scope string, budget int64) Mandate {
	t.Helper()
	m, err := s.Create(context.Background(), org, CreateParams{AgentID: agent, Scope: scope, Budget: budget})
	require.NoError(t, err)
	return m
}

func mustGet(t *testing.T, s *Service, org string, m Mandate) Mandate {
	t.Helper()
	got, err := s.Get(context.Background(), org, AnyAgent, m.ID)
	require.NoError(t, err)
	return got
}

// requireLedgerMatches asserts Σ ledger = spent for every mandate, read in
// one snapshot.
func requireLedgerMatches(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT m.id, m.spent, COALESCE(SUM(l.amount), 0)
		  FROM mandates m LEFT JOIN mandate_ledger l ON l.mandate_id = m.id
		 GROUP BY m.id, m.spent`)
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id any
		var spent, sum int64
		require.NoError(t, rows.Scan(&id, &spent, &sum))
		require.Equal(t, spent, sum, "ledger sum of mandate %v", id)
		n++
	}
	require.NoError(t, rows.Err())
	require.Positive(t, n, "there are mandates to check")
}

func countApprovals(t *testing.T, db *pgxpool.Pool, org, state string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM mandate_approvals WHERE org_id = $1 AND state = $2`, org, state).Scan(&n))
	return n
}

// lockMandate holds mandate id's row in a transaction of its own until the
// test rolls it back (tx.Rollback) or ends: a spend's batch waits for it.
func lockMandate(t *testing.T, db *pgxpool.Pool, id uuid.UUID) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM mandates WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	return tx
}

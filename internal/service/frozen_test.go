package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
)

// A replica frozen in the middle of a spend (its process stopped, a VM
// paused: its host's kernel still answers, so no network bound ends the
// connection) holds the mandate's row in an open transaction. The server
// ends such a session after the idle bound every connection of the
// service carries (db.IdleInTransaction, 15 s), and the spend waiting on
// that mandate is decided within its own 30 s; before, every spend of the
// mandate timed out until the frozen process thawed.
func TestASpendFrozenMidTransactionReleasesTheMandateAfterTheIdleBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testConfig(t)
	var pc *pgxpool.Config
	cfg.ConfigureDB = func(c *pgxpool.Config) { pc = c.Copy() }
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer svc.Close()
	m, err := svc.Mandates().Create(ctx, "org-1", mandates.CreateParams{AgentID: "agent-1", Scope: "tools", Budget: 10})
	require.NoError(t, err)

	// the frozen replica: a session of the service's, its spend half done
	frozen, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	require.NoError(t, err)
	defer frozen.Close(ctx)
	tx, err := frozen.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT spent FROM mandates WHERE org_id = $1 AND id = $2 FOR UPDATE`, "org-1", m.ID)
	require.NoError(t, err)
	// (it never sends its next statement)

	sctx, cancel := context.WithTimeout(ctx, db.IdleInTransaction+20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := svc.Mandates().Spend(sctx, mandates.SpendParams{OrgID: "org-1", AgentID: "agent-1", Scope: "tools", Cost: 1})
	require.NoError(t, err, "the spend waited on the frozen session's row lock")
	require.True(t, res.OK)
	require.GreaterOrEqual(t, time.Since(start), db.IdleInTransaction-time.Second, "it did wait for the row, which the frozen session held")
	require.Error(t, tx.Commit(ctx), "the server ended the frozen session")
}

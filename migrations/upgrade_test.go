package migrations_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/migrations"
)

// An index added to a table the replicas write all the time is built
// CONCURRENTLY: a plain build takes a SHARE lock, and while it waits for a
// transaction already writing the table (or scans it), every write the
// replicas still running make waits behind it. Here an enqueue's
// transaction is open when the upgrade starts; a second enqueue meanwhile
// must not wait for the build.
func TestAnUpgradesIndexBuildDoesNotHoldWritesToTheWorkTable(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "migrate_concurrent_index")
	db := openDB(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 25)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO workpool_pools (name, max_parallelism) VALUES ('default', 10)`)
	require.NoError(t, err)
	const enqueue = `INSERT INTO workpool_work (id, org_id, pool, handler, args, state, run_at, timeout_ms, created_at)
		VALUES (gen_random_uuid(), 'org-1', 'default', 'h', '{}', 'pending', now(), 60000, now())`

	open, err := db.BeginTx(ctx, nil) // an old replica's enqueue, under way
	require.NoError(t, err)
	defer func() { _ = open.Rollback() }()
	_, err = open.ExecContext(ctx, enqueue)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { _, err := migrations.Up(ctx, openDB(t, url), nil); migrated <- err }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE '%INDEX%workpool_work_pending_keyed_due%' AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 20*time.Second, 5*time.Millisecond, "the index build waits for the enqueue under way")

	conn, err := db.Conn(ctx) // another enqueue, meanwhile
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET lock_timeout = '5s'`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, enqueue)
	require.NoError(t, err, "an enqueue waited for the index build")

	require.NoError(t, open.Commit())
	require.NoError(t, <-migrated)
	var valid bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'workpool_work_pending_keyed_due'::regclass`).Scan(&valid))
	require.True(t, valid)
}

// No index duplicates another (same table, columns, operator classes,
// expressions and predicate): each is written at every insert.
func TestTheSchemaHasNoDuplicateIndexes(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, testkit.NewDatabase(t))
	rows, err := db.QueryContext(ctx, `
SELECT a.indexrelid::regclass::text, b.indexrelid::regclass::text
  FROM pg_index a JOIN pg_index b
    ON a.indrelid = b.indrelid AND a.indexrelid < b.indexrelid
   AND a.indkey::text = b.indkey::text AND a.indclass::text = b.indclass::text
   AND coalesce(pg_get_expr(a.indexprs, a.indrelid), '') = coalesce(pg_get_expr(b.indexprs, b.indrelid), '')
   AND coalesce(pg_get_expr(a.indpred, a.indrelid), '') = coalesce(pg_get_expr(b.indpred, b.indrelid), '')
  JOIN pg_class c ON c.oid = a.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public'`)
	require.NoError(t, err)
	defer rows.Close()
	var dups [][2]string
	for rows.Next() {
		var a, b string
		require.NoError(t, rows.Scan(&a, &b))
		dups = append(dups, [2]string{a, b})
	}
	require.NoError(t, rows.Err())
	require.Empty(t, dups, "indexes that duplicate another")
}

// A replica that starts while another applies migrations says it waits,
// and for whom; when the wait gives up, the error names the migration lock
// (goose's own said "failed to acquire lock", after five silent minutes).
func TestAMigratorWaitingForAnothersLockSaysSo(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "migrate_lock_wait")
	holder, err := openDB(t, url).Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, migrations.LockID) // another replica migrating
	require.NoError(t, err)
	migrations.SetLockWait(t, 2*time.Second)
	var log strings.Builder
	_, err = migrations.Up(ctx, openDB(t, url), slog.New(slog.NewTextHandler(&log, nil)))
	require.ErrorContains(t, err, "another process held the migration lock")
	require.Contains(t, log.String(), "waiting for another process's migrations")
	require.Contains(t, log.String(), "holder_pid=")
}

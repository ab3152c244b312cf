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

// Two tool policies whose matches differ only in where their nested
// objects close ({"env":{"region":"eu"}} and {"env":{},"region":"eu"}) are
// two policies under 00010's key. 00025 as first written made match's
// jsonb hash the unique key, and jsonb's hash ignores where objects close:
// a database holding both failed 00025, and every replica failed to start.
// Both a database at 24 and one that ran that first 00025 upgrade, and
// keep both policies.
func TestAnUpgradeKeepsToolPoliciesWhoseMatchesHashAlike(t *testing.T) {
	for _, tc := range []struct {
		name string
		from int64
		// what the database ran at version from, beyond this tree's files
		ran string
	}{
		{name: "from 24", from: 24},
		{name: "from the first 00025", from: 25, ran: `DROP INDEX tool_policies_key; CREATE UNIQUE INDEX tool_policies_key ON tool_policies
			(org_id, agent_id, tool_name, (jsonb_hash_extended(coalesce(match, 'null'::jsonb), 0)))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, emptyDatabase(t, "policy_hash_"+strings.ReplaceAll(tc.name, " ", "_")))
			p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			_, err = p.UpTo(ctx, tc.from)
			require.NoError(t, err)
			if tc.ran != "" {
				_, err = db.ExecContext(ctx, tc.ran)
				require.NoError(t, err)
			}
			insert := `INSERT INTO tool_policies (id, org_id, agent_id, tool_name, match, approval) VALUES (gen_random_uuid(), 'org-1', 'a1', 'deploy', $1, $2)`
			_, err = db.ExecContext(ctx, insert, `{"env": {"region": "eu"}}`, "always")
			require.NoError(t, err)
			if tc.ran == "" { // (that key holds them apart no more)
				_, err = db.ExecContext(ctx, insert, `{"env": {}, "region": "eu"}`, "never")
				require.NoError(t, err)
			}

			_, err = migrations.Up(ctx, db, nil)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, insert, `{"env": {}, "region": "eu"}`, "never")
			if tc.ran != "" {
				require.NoError(t, err, "the upgrade dropped the key that held them together")
			}
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM tool_policies WHERE org_id = 'org-1'`).Scan(&n))
			require.GreaterOrEqual(t, n, 2)
			// the unconditional policy is still one per (org, agent, tool)
			_, err = db.ExecContext(ctx, insert, nil, "once")
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, insert, nil, "never")
			require.ErrorContains(t, err, "tool_policies_unconditional")
		})
	}
}

// `engine migrate status` only reads: run while another replica applies a
// long migration (what an operator looks at then), it does not wait for
// the migration lock. It took the lock, waited the whole lock wait (5
// minutes) and failed with goose's "failed to acquire lock".
func TestStatusDoesNotWaitForTheMigrationLock(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "status_lock")
	_, err := migrations.Up(ctx, openDB(t, url), nil)
	require.NoError(t, err)
	holder, err := openDB(t, url).Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, migrations.LockID) // another replica migrating
	require.NoError(t, err)
	migrations.SetLockWait(t, time.Minute) // (a status that waits for it fails this test's deadline below)

	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var sb strings.Builder
	require.NoError(t, migrations.Status(sctx, openDB(t, url), &sb))
	require.Contains(t, sb.String(), "00001_foundation.sql")
}

// As TestAnUpgradesIndexBuildDoesNotHoldWritesToTheWorkTable, for a
// migration that must lock a busy table (00027's ALTER TABLE
// workpool_pools, which every enqueue reads): with an old replica's
// enqueue under way when the upgrade starts, a second enqueue meanwhile
// does not queue behind the ALTER waiting for the first. The migration
// gives up its wait after 100 ms and tries again; the upgrade still
// completes once the first enqueue commits.
func TestAnUpgradesAlterOfThePoolsTableDoesNotHoldEnqueues(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "alter_pools")
	db := openDB(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 26)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO workpool_pools (name, max_parallelism) VALUES ('default', 10)`)
	require.NoError(t, err)
	const enqueue = `INSERT INTO workpool_work (id, org_id, pool, handler, args, state, run_at, timeout_ms, created_at)
		SELECT gen_random_uuid(), 'org-1', 'default', 'h', '{}', 'pending', now(), 60000, now()
		WHERE (SELECT count(*) FROM workpool_pools WHERE name = ANY('{default}')) = 1`

	open, err := db.BeginTx(ctx, nil) // an old replica's enqueue, under way
	require.NoError(t, err)
	defer func() { _ = open.Rollback() }()
	_, err = open.ExecContext(ctx, enqueue)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { _, err := migrations.Up(ctx, openDB(t, url), nil); migrated <- err }()
	require.Eventually(t, func() bool {
		var tried bool
		// (not this query, whose own text holds the pattern: the ALTER
		// waiting for the table's lock behind the open enqueue)
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
			  AND query LIKE '%ALTER TABLE workpool_pools%')`).Scan(&tried))
		return tried
	}, time.Minute, time.Millisecond, "00027 tries its ALTER")

	conn, err := db.Conn(ctx) // another enqueue, meanwhile
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET lock_timeout = '10s'`) // (well past the migration's own 100 ms)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, enqueue)
	require.NoError(t, err, "an enqueue waited for the migration's ALTER TABLE")

	require.NoError(t, open.Commit())
	require.NoError(t, <-migrated)
}

// Up reports how many migrations it applied (`engine migrate up` prints
// "applied N migration(s)", serve logs "database migrated" applied=N).
// When a migration gives up its lock wait (55P03) and Up tries again, the
// migrations the failed attempt applied before it still count: goose
// returns them in its PartialError, not in its results.
func TestUpCountsTheMigrationsAppliedBeforeALockTimeoutRetry(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "retry_count")
	db := openDB(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 26)
	require.NoError(t, err)

	open, err := db.BeginTx(ctx, nil) // an old replica's tool call reading the policies, under way
	require.NoError(t, err)
	defer func() { _ = open.Rollback() }()
	_, err = open.ExecContext(ctx, `SELECT count(*) FROM tool_policies`)
	require.NoError(t, err)

	type result struct {
		n   int
		err error
	}
	migrated := make(chan result, 1)
	go func() { n, err := migrations.Up(ctx, openDB(t, url), nil); migrated <- result{n, err} }()
	dropWaits := func() bool {
		var waits bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE '%DROP INDEX IF EXISTS tool_policies_key%' AND wait_event_type = 'Lock')`).Scan(&waits))
		return waits
	}
	require.Eventually(t, dropWaits, time.Minute, time.Millisecond, "00029's DROP INDEX waits for the tool call")
	require.Eventually(t, func() bool { return !dropWaits() }, time.Minute, time.Millisecond, "and gives up (55P03)")
	require.NoError(t, open.Commit())

	r := <-migrated
	require.NoError(t, r.err)
	var v int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&v))
	sources := p.ListSources()
	latest := sources[len(sources)-1].Version
	require.Equal(t, latest, v)
	require.Equal(t, int(latest-26), r.n, "Up applied every migration from 00027 on, the retried 00029 counted once")
}

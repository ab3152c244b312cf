package migrations_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/migrations"
)

// databaseAt is a fresh database (named name) migrated up to version, its
// URL and a handle on it.
func databaseAt(t *testing.T, name string, version int64) (string, *sql.DB) {
	t.Helper()
	url := emptyDatabase(t, name)
	db := openDB(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), version)
	require.NoError(t, err)
	return url, db
}

// 00031 ALTERs mandate_ledger, which every spend writes, with the
// lock_timeout 00027 and 00029 set for the same reason: while the ALTER
// waits for the table's lock behind a spend under way on an old replica,
// every other spend queues behind it. Here an old replica's spend batch
// has written its ledger row and is still open (waiting on another
// mandate, as in mandates/ledger_order_test.go); another spend, on another
// mandate, must not wait for the migration.
func TestMigration31DoesNotQueueEverySpendBehindItsAlter(t *testing.T) {
	ctx := context.Background()
	url, db := databaseAt(t, "ledger_pos_lock", 30)
	_, err := db.ExecContext(ctx, `INSERT INTO mandates (id, org_id, agent_id, scope, budget) VALUES
		('00000000-0000-7000-8000-00000000000a', 'org-1', 'a', 'llm', 100),
		('00000000-0000-7000-8000-00000000000b', 'org-1', 'b', 'llm', 100)`)
	require.NoError(t, err)
	spend := func(mandate string) string {
		return `WITH d AS (UPDATE mandates SET spent = spent + 1 WHERE id = '` + mandate + `' RETURNING id)
			INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount) SELECT gen_random_uuid(), 'org-1', d.id, 'debit', 1 FROM d`
	}

	open, err := db.BeginTx(ctx, nil) // an old replica's spend batch, under way
	require.NoError(t, err)
	defer func() { _ = open.Rollback() }()
	_, err = open.ExecContext(ctx, spend("00000000-0000-7000-8000-00000000000a"))
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { _, err := migrations.Up(ctx, openDB(t, url), nil); migrated <- err }()
	require.Eventually(t, func() bool {
		var tried bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
			  AND query LIKE '%ALTER TABLE mandate_ledger%')`).Scan(&tried))
		return tried
	}, time.Minute, time.Millisecond, "00031 tries its ALTER")

	conn, err := db.Conn(ctx) // another spend, meanwhile
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET lock_timeout = '5s'`) // (well past 00027's 100 ms)
	require.NoError(t, err)
	start := time.Now()
	_, err = conn.ExecContext(ctx, spend("00000000-0000-7000-8000-00000000000b"))
	require.NoError(t, err, "a spend waited %s for the migration's ALTER TABLE", time.Since(start).Round(time.Millisecond))

	require.NoError(t, open.Commit())
	require.NoError(t, <-migrated)
}

// 00031 numbers the entries already in a ledger in their id order (the
// order they were listed in), before every entry written after it.
func TestMigration31KeepsTheLedgersOrderAndPutsNewEntriesAfterIt(t *testing.T) {
	ctx := context.Background()
	_, db := databaseAt(t, "ledger_pos_order", 30)
	_, err := db.ExecContext(ctx, `INSERT INTO mandates (id, org_id, agent_id, scope, budget) VALUES
		('00000000-0000-7000-8000-00000000000a', 'org-1', 'a', 'llm', 100)`)
	require.NoError(t, err)
	// (inserted newest first: the table's physical order is not the ids')
	for _, id := range []string{"00000000-0000-7000-8000-000000000003", "00000000-0000-7000-8000-000000000002", "00000000-0000-7000-8000-000000000001"} {
		_, err = db.ExecContext(ctx, `INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount)
			VALUES ($1, 'org-1', '00000000-0000-7000-8000-00000000000a', 'debit', 1)`, id)
		require.NoError(t, err)
	}
	_, err = migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO mandate_ledger (id, org_id, mandate_id, kind, amount)
		VALUES ('00000000-0000-7000-8000-000000000000', 'org-1', '00000000-0000-7000-8000-00000000000a', 'debit', 1)`)
	require.NoError(t, err)

	rows, err := db.QueryContext(ctx, `SELECT id::text FROM mandate_ledger ORDER BY pos`)
	require.NoError(t, err)
	var order []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002",
		"00000000-0000-7000-8000-000000000003", "00000000-0000-7000-8000-000000000000"}, order,
		"the old entries in id order, then the one written after the migration, whatever its id")
}

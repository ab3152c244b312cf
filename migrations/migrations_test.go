package migrations_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/migrations"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestApplyingTwiceChangesNothing(t *testing.T) {
	db := openDB(t, testkit.NewDatabase(t))
	ctx := context.Background()
	n, err := migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	require.Zero(t, n, "a migrated database has nothing pending")
	n, err = migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	require.Zero(t, n)

	var sb strings.Builder
	require.NoError(t, migrations.Status(ctx, db, &sb))
	require.Contains(t, sb.String(), "00001_foundation.sql")
	require.NotContains(t, sb.String(), "pending")
}

// A version a newer binary applied (as after a rollback to this one) is
// listed by status as unknown to this binary, and by Unknown; Up leaves it.
func TestStatusListsAppliedVersionsThisBinaryDoesNotKnow(t *testing.T) {
	db := openDB(t, testkit.NewDatabase(t))
	ctx := context.Background()
	unknown, err := migrations.Unknown(ctx, db)
	require.NoError(t, err)
	require.Empty(t, unknown, "a database this binary migrated")

	_, err = db.ExecContext(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (9021, true), (9022, true), (9023, true), (9023, false)`)
	require.NoError(t, err)

	n, err := migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	unknown, err = migrations.Unknown(ctx, db)
	require.NoError(t, err)
	var versions []int64
	for _, u := range unknown {
		versions = append(versions, u.Version)
		require.False(t, u.AppliedAt.IsZero())
	}
	require.Equal(t, []int64{9021, 9022}, versions, "9023's latest row says it was rolled back")
	var sb strings.Builder
	require.NoError(t, migrations.Status(ctx, db, &sb))
	lines := strings.Split(strings.TrimSpace(sb.String()), "\n")
	require.Regexp(t, `^09021  \?\s+applied \S+Z, unknown to this binary$`, lines[len(lines)-2])
	require.Regexp(t, `^09022  \?\s+applied \S+Z, unknown to this binary$`, lines[len(lines)-1])
	require.NotContains(t, sb.String(), "09023")
	require.Contains(t, lines[0], "00001_foundation.sql")
}

// emptyDatabase creates (again) the database name beside the test's
// template-cloned one and returns its URL.
func emptyDatabase(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	admin := openDB(t, testkit.ServerURL(t))
	_, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
	require.NoError(t, err)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	url := strings.Replace(testkit.ServerURL(t), "/postgres?", "/"+name+"?", 1)
	require.NotEqual(t, testkit.ServerURL(t), url, "the empty database, not the server's")
	return url
}

func TestAnUnmigratedDatabaseHasNoUnknownVersions(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "migrate_empty")

	unknown, err := migrations.Unknown(ctx, openDB(t, url))
	require.NoError(t, err)
	require.Empty(t, unknown)
}

func TestConcurrentMigratorsDoNotFail(t *testing.T) {
	ctx := context.Background()
	url := emptyDatabase(t, "migrate_race")

	var wg sync.WaitGroup
	errs := make([]error, 4)
	applied := make([]int, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := openDB(t, url)
			applied[i], errs[i] = migrations.Up(ctx, db, nil)
		}()
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		require.NoError(t, err, "migrator %d", i)
		total += applied[i]
	}
	var sb strings.Builder
	require.NoError(t, migrations.Status(ctx, openDB(t, url), &sb))
	require.Equal(t, strings.Count(sb.String(), "\n"), total, "each migration applied exactly once across migrators")
}

func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

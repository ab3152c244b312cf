package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/migrations"
)

// Every migration's Down undoes its Up: the latest rolls back and applies
// again, and the whole schema rolls back to nothing and migrates up again.
func TestEveryMigrationRollsBackAndAppliesAgain(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, emptyDatabase(t, "migrate_down"))
	n, err := migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Files(), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.NoError(t, err, "the latest down")
	_, err = p.UpByOne(ctx)
	require.NoError(t, err, "the latest up again")
	for i := n; i > 0; i-- {
		_, err := p.Down(ctx)
		require.NoError(t, err, "down from version %d", i)
	}
	again, err := migrations.Up(ctx, db, nil)
	require.NoError(t, err)
	require.Equal(t, n, again)
}

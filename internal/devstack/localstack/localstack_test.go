package localstack

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
)

func TestTheDevSecretIsMadeOnceAndKept(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadDevSecret(dir)
	require.Error(t, err, "none before the first dev run")

	secret, path, err := DevSecret(dir)
	require.NoError(t, err)
	require.Len(t, secret, 64, "32 random bytes, hex")
	again, samePath, err := DevSecret(dir)
	require.NoError(t, err)
	require.Equal(t, secret, again)
	require.Equal(t, path, samePath)
	read, err := ReadDevSecret(dir)
	require.NoError(t, err)
	require.Equal(t, secret, read)
}

// A second process on a data dir in use fails at once, naming the first,
// instead of sharing (and at its exit stopping) the first one's Postgres.
func TestAStackHoldsItsDataDirUntilStopped(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { _ = devstack.RemoveDataDir(context.Background(), dir) })
	st, err := Start(ctx, Options{DataDir: dir, Postgres: true, Holder: "engine test"})
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, st.DatabaseURL())
	require.NoError(t, err, "the engine's database exists")
	require.NoError(t, conn.Close(ctx))
	require.Empty(t, st.TemporalAddress(), "Temporal was not asked for")

	_, err = Start(ctx, Options{DataDir: dir, Postgres: true, Holder: "engine other"})
	require.ErrorIs(t, err, devstack.ErrDataDirInUse)
	require.ErrorContains(t, err, "engine test")

	st.Stop()
	again, err := Start(ctx, Options{DataDir: dir, Postgres: true, Holder: "engine other"})
	require.NoError(t, err, "free once the first has stopped")
	again.Stop()
}

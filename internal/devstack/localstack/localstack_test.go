package localstack

import (
	"context"
	"os"
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

// A port out of range is refused before the data dir is touched: Temporal
// refused -1 only after initdb had run and Postgres had started.
func TestAPortOutOfRangeIsRefusedBeforeAnythingStarts(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"a negative Temporal port", Options{Postgres: true, Temporal: true, TemporalPort: -1}, "embedded Temporal: port -1: want 1 to 65535, or 0 for a free one"},
		{"a Temporal port above 65535", Options{Postgres: true, Temporal: true, TemporalPort: 70000}, "embedded Temporal: port 70000"},
		{"a Postgres port above 65535", Options{Postgres: true, PostgresPort: 65536}, "local Postgres: port 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.opts.DataDir = dir

			_, err := Start(context.Background(), tc.opts)

			require.ErrorContains(t, err, tc.want)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, entries, "nothing made in the data dir: no lock, no cluster")
		})
	}
}

package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
)

// nowhere is a DATABASE_URL and a Temporal address never dialled: a bench
// refused for its flags fails before it starts or dials anything, and one
// that got past its flags fails at connecting (its context is done).
var nowhere = service.Config{DatabaseURL: "postgres://never-dialled.invalid/reveille", TemporalAddress: "never-dialled.invalid:7233"}

func doneContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// Flags a run cannot use are refused at once, naming the flag — not after
// Postgres (and Temporal) started, by the error of a service the user never
// configured (--concurrency widens the wakeup pool; --batch is one
// append's chunks, --size one chunk, and --size × --batch one append's
// bytes) — and a flag the run does not use is not checked
// (--rounds is used only with --together=false: `bench wake --n 1` was
// refused for it). Found by review.
func TestABenchsFlagsAreRefusedBeforeItStartsAnythingNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func() error
		flag string // "": refused for no flag (fails at connecting)
	}{
		{"wake: concurrency past a pool's most slots", func() error {
			return Wake(doneContext(), WakeConfig{Service: nowhere, N: 1, Concurrency: 20000, Together: true, Rounds: 1})
		}, "concurrency"},
		{"wake: rounds past n without together", func() error {
			return Wake(doneContext(), WakeConfig{Service: nowhere, N: 1, Concurrency: 50, Together: false, Rounds: 2})
		}, "rounds"},
		{"wake: --n 1 with the default rounds (2) and together", func() error {
			return Wake(doneContext(), WakeConfig{Service: nowhere, N: 1, Concurrency: 50, RestN: 2000, Together: true, Rounds: 2})
		}, ""},
		{"streams: batch past the chunks one append holds", func() error {
			return Streams(doneContext(), StreamsConfig{Service: nowhere, Writers: 1, Chunks: 20000, Size: 16, Batch: 2000, Rounds: 1})
		}, "batch"},
		{"streams: size past the largest chunk", func() error {
			return Streams(doneContext(), StreamsConfig{Service: nowhere, Writers: 1, Chunks: 10, Size: 2 << 20, Batch: 1, Rounds: 1})
		}, "size"},
		{"streams: size × batch past the largest append", func() error {
			return Streams(doneContext(), StreamsConfig{Service: nowhere, Writers: 1, Chunks: 100, Size: 512 << 10, Batch: 20, Rounds: 1})
		}, "size × batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			require.Error(t, err)
			if tc.flag == "" {
				require.NotContains(t, err.Error(), "need", "refused for a flag: %v", err)
				return
			}
			require.Contains(t, err.Error(), tc.flag, "the error names the flag: %v", err)
			require.True(t, strings.HasPrefix(err.Error(), "need "), "refused for its flags, not at connecting: %v", err)
		})
	}
}

// A DATABASE_URL naming its database in the query (?dbname=, which pgx,
// as libpq, lets win over the path) gets the run's fresh database there
// too: the benches migrated and wrote into the database it named, and
// dropped only the empty one they created. Found by review.
func TestABenchsDatabaseOverridesOneNamedInTheURLsQuery(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u@127.0.0.1:5432/?dbname=prod&sslmode=disable",
		"postgres://u@127.0.0.1:5432/reveille?dbname=prod",
		"postgres://u@127.0.0.1:5432/reveille?database=prod",
		"host=127.0.0.1 dbname=prod",
	} {
		got, err := withDatabase(dsn, "bench_x")
		require.NoError(t, err, dsn)
		cfg, err := pgx.ParseConfig(got)
		require.NoError(t, err, dsn)
		require.Equal(t, "bench_x", cfg.Database, "%s became %s", dsn, got)
	}
}

// The same end to end: with DATABASE_URL naming a database in its query,
// bench spend leaves that database untouched.
func TestASpendBenchLeavesTheDatabaseOfAQueryDbnameUntouched(t *testing.T) {
	ctx := context.Background()
	user := testkit.NewDatabase(t) // a migrated database standing for the user's
	ucfg, err := pgx.ParseConfig(user)
	require.NoError(t, err)
	admin := testkit.ServerURL(t)
	sep := "?"
	if strings.Contains(admin, "?") {
		sep = "&"
	}
	var runErr error
	out := captureStdout(t, func() {
		runErr = Spend(ctx, SpendConfig{Service: service.Config{DatabaseURL: admin + sep + "dbname=" + ucfg.Database},
			Clients: 2, N: 20, Mandates: 2, Batch: 4, Keyed: true})
	})
	require.NoError(t, runErr, out)
	conn, err := pgx.Connect(ctx, user)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var mandates int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM mandates`).Scan(&mandates))
	require.Zero(t, mandates, "the bench wrote its mandates into DATABASE_URL's database %s", ucfg.Database)
}

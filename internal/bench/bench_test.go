package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestWithDatabaseNamesTheRunsDatabase(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@127.0.0.1:5432/pool?sslmode=disable", "postgres://u:p@127.0.0.1:5432/bench_x?sslmode=disable"},
		{"postgresql://127.0.0.1/reveille", "postgresql://127.0.0.1/bench_x"},
		{"postgres://127.0.0.1:5432", "postgres://127.0.0.1:5432/bench_x"},
		{"host=127.0.0.1 dbname=pool user=u", "host=127.0.0.1 dbname=pool user=u dbname=bench_x"},
	} {
		got, err := withDatabase(tc.dsn, "bench_x")
		require.NoError(t, err, tc.dsn)
		require.Equal(t, tc.want, got, tc.dsn)
		cfg, err := pgx.ParseConfig(got)
		require.NoError(t, err, tc.dsn)
		require.Equal(t, "bench_x", cfg.Database, "%s: the last dbname wins", tc.dsn)
	}
}

// databases lists the server's databases whose names start with prefix.
func databases(t *testing.T, admin, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY 1`, prefix)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// Each run gets an empty database of its own beside the given one, and
// none is left behind.
func TestEveryRunHasAFreshDatabaseDroppedAtTheEnd(t *testing.T) {
	ctx := context.Background()
	admin := testkit.ServerURL(t)
	first, err := setUp(ctx, service.Config{DatabaseURL: admin}, "fresh", "", false)
	require.NoError(t, err)
	second, err := setUp(ctx, service.Config{DatabaseURL: admin}, "fresh", "", false)
	require.NoError(t, err)
	require.NotEqual(t, first.databaseURL, second.databaseURL)
	require.ElementsMatch(t, []string{first.database, second.database}, databases(t, admin, "bench_fresh_"))

	conn, err := pgx.Connect(ctx, first.databaseURL)
	require.NoError(t, err)
	var tables int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
	require.Zero(t, tables, "a fresh database holds nothing of an earlier run")
	// A connection still open does not keep the database alive.
	defer conn.Close(ctx)

	first.tearDown(false)
	second.tearDown(false)
	require.Empty(t, databases(t, admin, "bench_fresh_"))
}

func TestThePoolBenchBurnsDownThroughTheServiceAndLeavesNothing(t *testing.T) {
	admin := testkit.ServerURL(t)
	err := Pool(context.Background(), PoolConfig{Service: service.Config{DatabaseURL: admin}, N: 40, Parallelism: 8, Batch: 16, Hook: true,
		Orgs: 1, Rounds: 1})
	require.NoError(t, err)
	require.Empty(t, databases(t, admin, "bench_pool_"))
}

// --orgs 0 ran the single-org burn-down and --rounds 0 one round: a count
// given as 0 is refused before anything starts (the context here is
// already canceled, so nothing could).
func TestThePoolBenchRefusesZeroOrgsOrRoundsAtStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, c := range map[string]PoolConfig{
		"orgs":   {N: 40, Parallelism: 8, Batch: 16, Orgs: 0, Rounds: 2},
		"rounds": {N: 40, Parallelism: 8, Batch: 16, Orgs: 2, Rounds: 0},
	} {
		c.Service = service.Config{DatabaseURL: "postgres://never-dialled.invalid/reveille"}
		require.ErrorContains(t, Pool(ctx, c), "need orgs ≥ 1, rounds ≥ 1", name)
	}
}

// --n 10 --orgs 20 ran the whole single-org burn-down, then failed reading
// the start lags of the orgs that got no item: fewer items than orgs is
// refused before anything starts.
func TestThePoolBenchRefusesFewerItemsThanOrgsAtStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := PoolConfig{Service: service.Config{DatabaseURL: "postgres://never-dialled.invalid/reveille"},
		N: 10, Parallelism: 8, Batch: 16, Orgs: 20, Rounds: 1}
	require.EqualError(t, Pool(ctx, c), "need n ≥ orgs: each of the 20 orgs needs at least one of the 10 items")
}

func TestThePoolBenchTimesFairShareBesideOneOrgAndLeavesNothing(t *testing.T) {
	admin := testkit.ServerURL(t)
	err := Pool(context.Background(), PoolConfig{Service: service.Config{DatabaseURL: admin}, N: 60, Parallelism: 8, Batch: 16, Hook: true,
		Orgs: 3, Rounds: 1})
	require.NoError(t, err)
	require.Empty(t, databases(t, admin, "bench_pool_"))
}

func TestTheSpendBenchChecksTheLedgerThroughTheMandatesAPI(t *testing.T) {
	admin := testkit.ServerURL(t)
	err := Spend(context.Background(), SpendConfig{Service: service.Config{DatabaseURL: admin}, Clients: 4, N: 100, Mandates: 4, Batch: 8, Keyed: true})
	require.NoError(t, err, "every spend granted within budget, the ledger matching")
	require.Empty(t, databases(t, admin, "bench_spend_"))
}

func TestTheRestBenchAnswersEachRouteOverHTTPAndLeavesNothing(t *testing.T) {
	admin := testkit.ServerURL(t)
	for _, route := range []string{RestWakeup, RestSpend, RestAppend} {
		t.Run(route, func(t *testing.T) {
			err := Rest(context.Background(), RestConfig{Service: service.Config{DatabaseURL: admin}, Route: route,
				Clients: 2, Agents: 2, Duration: 100 * time.Millisecond, Keyed: route == RestSpend})
			require.NoError(t, err, "every request answered with its route's success status")
			require.Empty(t, databases(t, admin, "bench_rest_"))
		})
	}
	t.Run("wake-ups past the org's pending cap", func(t *testing.T) {
		// Nothing drains the paused wakeup pool while the wake-ups are
		// measured, so every request leaves an item pending: a run past
		// the org's cap (100,000 by default: half a minute on a quiet
		// machine) ended in 429s instead of a figure. Found by review.
		cfg := service.Config{DatabaseURL: admin}
		cfg.Workpool.MaxPendingPerOrg = 50
		err := Rest(context.Background(), RestConfig{Service: cfg, Route: RestWakeup,
			Clients: 2, Agents: 2, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond})
		require.NoError(t, err, "the route measured, not the cap filling up behind the paused pool")
	})
	t.Run("an unknown route is refused", func(t *testing.T) {
		err := Rest(context.Background(), RestConfig{Route: "nope", Clients: 1, Agents: 1, Duration: time.Second})
		require.ErrorContains(t, err, `unknown route "nope"`)
	})
}

// The streams bench measures a tail's latency from readers subscribed
// before the writers start: a reader refused (the org's cap of live
// streams: a 429 whose Retry-After the client would wait out, counted as
// tail latency) fails the run at once, naming the answer, and leaves
// nothing behind.
func TestTheStreamsBenchFailsWhenAReaderIsRefused(t *testing.T) {
	admin := testkit.ServerURL(t)
	svc := service.Config{DatabaseURL: admin}
	svc.API.OrgMaxStreams = 2
	err := Streams(context.Background(), StreamsConfig{Service: svc, Writers: 4, Chunks: 400, Size: 16, Batch: 10, Rounds: 1})
	require.ErrorContains(t, err, "answered 429 Too Many Requests")
	require.Empty(t, databases(t, admin, "bench_streams_"))
}

// The streams bench, end to end: every chunk read once, in order, by
// readers subscribed before the first append.
func TestTheStreamsBenchReadsEveryChunkOnceAndLeavesNothing(t *testing.T) {
	admin := testkit.ServerURL(t)
	err := Streams(context.Background(), StreamsConfig{Service: service.Config{DatabaseURL: admin}, Writers: 2, Chunks: 200, Size: 16, Batch: 10, Rounds: 1})
	require.NoError(t, err)
	require.Empty(t, databases(t, admin, "bench_streams_"))
}

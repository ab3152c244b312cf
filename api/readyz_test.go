package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/migrations"
)

// readyz follows Postgres: 503 while it is down, 200 once it is back. The
// test runs its own cluster so it can stop and restart it.
func TestReadyzFollowsPostgres(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop(context.Background()); _ = os.RemoveAll(pg.ClusterDir()) })
	pool, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.UpPool(ctx, pool, nil)
	require.NoError(t, err)

	s := newTestServer(t, func(_ *Config, svc *Services) { svc.DB = pool })
	require.Equal(t, http.StatusOK, do(t, s.Handler(), "GET", "/readyz", "", nil).Status)
	require.Equal(t, "1", metricDependencyUp(t, s, "postgres"))

	port := pg.Port()
	require.NoError(t, pg.Stop(ctx))
	p := do(t, s.Handler(), "GET", "/readyz", "", nil).requireProblem(t, http.StatusServiceUnavailable)
	require.Contains(t, p["detail"], "postgres")
	require.Contains(t, p["checks"].(map[string]any)["postgres"], "down: ")
	require.Equal(t, "0", metricDependencyUp(t, s, "postgres"))
	require.Equal(t, http.StatusOK, do(t, s.Handler(), "GET", "/healthz", "", nil).Status, "liveness does not depend on Postgres")

	pg, err = devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir, Port: port})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	require.Eventually(t, func() bool { return do(t, s.Handler(), "GET", "/readyz", "", nil).Status == http.StatusOK }, testWait, pollEvery)
}

// Only Postgres makes a replica unready: with Temporal down it still takes
// work (the signals wait in the outbox), so /readyz stays 200 and says
// which dependency is down, as reveille_dependency_up does (issue 15
// overrides SPEC §2 here).
func TestReadyzIsUnreadyOnlyWithoutPostgres(t *testing.T) {
	down := func(context.Context) error { return context.DeadlineExceeded }
	up := func(context.Context) error { return nil }
	cases := []struct {
		name       string
		temporal   func(context.Context) error
		wantCheck  string
		wantMetric string
	}{
		{name: "temporal up", temporal: up, wantCheck: "ok", wantMetric: "1"},
		{name: "temporal down", temporal: down, wantCheck: "down: context deadline exceeded", wantMetric: "0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, func(_ *Config, svc *Services) {
				svc.Ready = []ReadinessCheck{{Name: "temporal", Check: tc.temporal}}
			})
			r := do(t, s.Handler(), "GET", "/readyz", "", nil)
			require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
			body := r.JSON(t)
			require.Equal(t, "ready", body["status"])
			require.Equal(t, map[string]any{"postgres": "ok", "temporal": tc.wantCheck}, body["checks"])
			require.Equal(t, tc.wantMetric, metricDependencyUp(t, s, "temporal"))
			require.Equal(t, "1", metricDependencyUp(t, s, "postgres"))
		})
	}
}

// metricDependencyUp is the value of reveille_dependency_up{dependency=name} in
// the server's /metrics.
func metricDependencyUp(t *testing.T, s *Server, name string) string {
	t.Helper()
	r := do(t, s.Handler(), "GET", "/metrics", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	prefix := `reveille_dependency_up{dependency="` + name + `"} `
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	t.Fatalf("no %s in /metrics", prefix)
	return ""
}

// A /readyz answered 503 — Postgres out of reach — is the probe working:
// on the API listener and on the ops listener alike it is counted in
// reveille_http_requests_total (the documented alert on rising 503s) and
// logged by its access log line alone, at INFO with its request id, never
// as a request that failed; the ops listener's other requests are counted
// and logged as well. (On the ops listener they were neither counted nor
// access-logged, and each 503 was an error line with an empty request id.)
func TestAProbeAnsweredNotReadyIsCountedAndLoggedOnEveryListener(t *testing.T) {
	var logs testkit.LogBuffer
	unreachable, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(unreachable.Close)
	s := newTestServer(t, func(c *Config, svc *Services) {
		c.OpsAddr = "127.0.0.1:0"
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		svc.DB = unreachable
	})
	cases := []struct {
		name       string
		listener   http.Handler
		path       string
		wantStatus int
	}{
		{name: "readyz on the API listener", listener: s.Handler(), path: "/readyz", wantStatus: http.StatusServiceUnavailable},
		{name: "readyz on the ops listener", listener: s.ops, path: "/readyz", wantStatus: http.StatusServiceUnavailable},
		{name: "healthz on the ops listener", listener: s.ops, path: "/healthz", wantStatus: http.StatusOK},
		{name: "metrics on the ops listener", listener: s.ops, path: "/metrics", wantStatus: http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status := strconv.Itoa(tc.wantStatus)
			before := requestsTotal(t, s, http.MethodGet, tc.path, status)
			r := do(t, tc.listener, http.MethodGet, tc.path, "", nil)
			require.Equal(t, tc.wantStatus, r.Status, "body: %s", r.Body)
			require.Equal(t, before+1, requestsTotal(t, s, http.MethodGet, tc.path, status))
			requestID := r.Header.Get(echo.HeaderXRequestID)
			require.NotEmpty(t, requestID)
			require.Equal(t, []string{"INFO http request " + status}, logLinesOf(t, &logs, requestID))
		})
	}
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
	require.NotContains(t, logs.String(), `"request_id":""`)
}

// A replica whose every pooled connection is busy (many spends queued on
// one mandate's row lock, say) still reaches Postgres: /readyz says ready.
// It asked through the pool, so it waited for a connection, gave up after
// readyTimeout and answered 503 "postgres unreachable" — every replica
// saturated by the same contention left the load balancer's rotation at
// once, turning slowness into an outage.
func TestReadyzIsReadyWhileEveryPooledConnectionIsBusy(t *testing.T) {
	s := newTestServer(t, func(_ *Config, svc *Services) { svc.DB = saturatedPool(t, testkit.NewDatabase(t)) })

	r := do(t, s.Handler(), "GET", "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, map[string]any{"postgres": "ok"}, r.JSON(t)["checks"])
	require.Equal(t, "1", metricDependencyUp(t, s, "postgres"))
}

// Probes that come together while every pooled connection is busy share
// one connection of their own: each dialled its own, so a replica budgeted
// one connection beyond its pool (a role's CONNECTION LIMIT, or
// max_connections shared by the replicas) got "too many connections" for
// most of them, answered 503 and left the rotation anyway.
func TestReadyzOpensAtMostOneConnectionBeyondASaturatedPool(t *testing.T) {
	s := newTestServer(t, func(_ *Config, svc *Services) { svc.DB = saturatedPool(t, budgetedDSN(t)) })

	var wg sync.WaitGroup
	var mu sync.Mutex
	var notReady []string
	for range 8 { // probes arriving together
		wg.Go(func() {
			r := do(t, s.Handler(), "GET", "/readyz", "", nil)
			if r.Status != http.StatusOK {
				mu.Lock()
				notReady = append(notReady, string(r.Body))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Empty(t, notReady, "probes answered not ready while Postgres answered")
}

// saturatedPool is a pool of two connections on dsn, both held until the
// test ends.
func saturatedPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for range cfg.MaxConns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		t.Cleanup(c.Release)
	}
	return pool
}

// As TestReadyzOpensAtMostOneConnectionBeyondASaturatedPool, for probes
// that come one after another (a prober and a scrape, or that test's 8
// goroutines when the scheduler runs them apart): each dialled its own
// connection just after the previous one closed its, whose backend had not
// always exited yet, and got "too many connections for role": a 503.
func TestReadyzProbesOneAfterAnotherStayWithinTheConnectionBudget(t *testing.T) {
	s := newTestServer(t, func(_ *Config, svc *Services) { svc.DB = saturatedPool(t, budgetedDSN(t)) })
	var bad []string
	for i := range 300 {
		r := do(t, s.Handler(), "GET", "/readyz", "", nil)
		if r.Status != http.StatusOK {
			bad = append(bad, fmt.Sprintf("probe %d: %s", i, r.Body))
		}
	}
	require.Empty(t, bad)
}

// budgetedDSN is a fresh database's DSN as a role allowed three
// connections: saturatedPool's two and one more.
func budgetedDSN(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testkit.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	role := fmt.Sprintf("readyz_budget_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw' CONNECTION LIMIT 3`, role))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE "+role) })
	u, err := url.Parse(testkit.NewDatabase(t))
	require.NoError(t, err)
	u.User = url.UserPassword(role, "pw")
	return u.String()
}

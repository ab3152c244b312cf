package api

import (
	"context"
	"net/http"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
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

	port := pg.Port()
	require.NoError(t, pg.Stop(ctx))
	p := do(t, s.Handler(), "GET", "/readyz", "", nil).requireProblem(t, http.StatusServiceUnavailable)
	require.Contains(t, p["detail"], "postgres")
	require.Equal(t, http.StatusOK, do(t, s.Handler(), "GET", "/healthz", "", nil).Status, "liveness does not depend on Postgres")

	pg, err = devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir, Port: port})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	require.Eventually(t, func() bool { return do(t, s.Handler(), "GET", "/readyz", "", nil).Status == http.StatusOK }, testWait, pollEvery)
}

func TestReadyzReportsAFailingExtraCheck(t *testing.T) {
	s := newTestServer(t, func(_ *Config, svc *Services) {
		svc.Ready = []ReadinessCheck{{Name: "temporal", Check: func(context.Context) error { return context.DeadlineExceeded }}}
	})
	p := do(t, s.Handler(), "GET", "/readyz", "", nil).requireProblem(t, http.StatusServiceUnavailable)
	require.Contains(t, p["detail"], "temporal")
}

package devstack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The test runs as whoever runs `go test`: as root it exercises the postgres
// system user and the fallback directory, as a normal user the plain path.
func TestStartStopAndReuseFromPrivateTempDir(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(parent, 0o700))
	dataDir := filepath.Join(parent, "data")

	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = pg.Stop(context.Background())
		_ = os.RemoveAll(pg.ClusterDir())
		_ = os.RemoveAll(parent)
	})
	require.False(t, pg.Reused())
	require.NoError(t, pg.EnsureDatabase(ctx, "reveille"))
	require.NoError(t, pg.EnsureDatabase(ctx, "reveille"), "ensuring twice is fine")
	execSQL(t, pg.URL("reveille"), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")

	// A second start while the first postmaster lives reuses it.
	again, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	require.NoError(t, err)
	require.True(t, again.Reused())
	require.Equal(t, pg.Port(), again.Port())
	require.NoError(t, again.Stop(ctx), "stopping a reused postmaster leaves it to its owner")
	require.Equal(t, 42, queryInt(t, pg.URL("reveille"), "SELECT v FROM kept"))

	// A postmaster whose starter died (a killed `engine dev`) is adopted:
	// the next run stops it on exit. The starter may not have been reaped
	// yet: a zombie is dead too.
	dead := zombie(t)
	require.NoError(t, os.WriteFile(filepath.Join(pg.ClusterDir(), "reveille.owner"), []byte(strconv.Itoa(dead)), 0o644))
	adopter, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	require.NoError(t, err)
	require.True(t, adopter.Reused())
	require.NoError(t, adopter.Stop(ctx))
	select {
	case <-pg.Wait():
	case <-time.After(30 * time.Second):
		t.Fatal("the adopted postmaster was not stopped")
	}
	// (what engine devstack reports when its Postgres ends under it)
	require.ErrorContains(t, pg.Exited(), "its log is "+filepath.Join(pg.ClusterDir(), "server.log"))

	// Stopped, then started again: the data dir is reused, not re-initialized.
	require.NoError(t, pg.Stop(ctx))
	third, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = third.Stop(context.Background()) })
	require.False(t, third.Reused())
	require.Equal(t, 42, queryInt(t, third.URL("reveille"), "SELECT v FROM kept"))
}

func TestProcessGoneCountsZombiesAsGone(t *testing.T) {
	reaped := exec.Command("true")
	require.NoError(t, reaped.Run())
	live := exec.Command("sleep", "300")
	require.NoError(t, live.Start())
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	cases := []struct {
		name string
		pid  int
		gone bool
	}{
		{"no pid", 0, true},
		{"exited and reaped", reaped.Process.Pid, true},
		{"exited, not reaped yet", zombie(t), true},
		{"running", live.Process.Pid, false},
		{"this process", os.Getpid(), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.gone, processGone(tc.pid))
		})
	}
}

// zombie is the pid of a child that has exited and that nothing has
// waited for yet (it is reaped at the end of the test).
func zombie(t *testing.T) int {
	t.Helper()
	_, err := os.Stat("/proc/self")
	require.NoError(t, err, "telling a zombie needs Linux's /proc (devstack's process checks read it)")
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Wait() })
	stat := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat"
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(stat)
		return err == nil && strings.Contains(string(b), ") Z ")
	}, 10*time.Second, 5*time.Millisecond)
	return cmd.Process.Pid
}

func TestMissingDataDirIsAnError(t *testing.T) {
	_, err := StartPostgres(context.Background(), PostgresOptions{})
	require.ErrorContains(t, err, "DataDir")
}

func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), sql)
	require.NoError(t, err)
}

func queryInt(t *testing.T, url, sql string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v int
	require.NoError(t, conn.QueryRow(context.Background(), sql).Scan(&v))
	return v
}

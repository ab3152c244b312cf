package devstack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A postmaster that died and was not reaped (its starter, a killed
// `engine dev`, is gone, and the process that inherited it does not reap)
// leaves postmaster.pid naming a zombie. livePostmaster counts the zombie as
// dead, as processGone documents; postgres does not (the pid exists) and
// refuses the lock file. The start may fail, but must not tell the user to
// delete the cluster for it.
func TestAClusterWhosePostmasterIsAnUnreapedZombieStartsOrSaysWhy(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	dataDir := filepath.Join(parent, "data")
	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	cluster := pg.ClusterDir()
	t.Cleanup(func() { _ = os.RemoveAll(cluster); _ = os.RemoveAll(parent) })
	port := pg.Port()
	require.NoError(t, pg.Stop(ctx))

	// The dead postmaster: a zombie of the server user, named by the
	// postmaster.pid a postmaster killed with SIGKILL leaves behind.
	runAs, err := serverUser()
	require.NoError(t, err)
	cmd := exec.Command("true")
	if runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
	}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Wait() })
	dead := cmd.Process.Pid
	require.Eventually(t, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(dead) + "/stat")
		return err == nil && strings.Contains(string(b), ") Z ")
	}, 10*time.Second, 5*time.Millisecond)
	pidFile := fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n127.0.0.1\n        0         0\nready   \n", dead, cluster, time.Now().Unix(), port, cluster)
	require.NoError(t, os.WriteFile(filepath.Join(cluster, "postmaster.pid"), []byte(pidFile), 0o600))
	if runAs != nil {
		require.NoError(t, os.Chown(filepath.Join(cluster, "postmaster.pid"), int(runAs.Uid), int(runAs.Gid)))
	}
	require.True(t, processGone(dead), "the zombie counts as gone")

	again, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	if err == nil {
		_ = again.Stop(ctx)
		return
	}
	// Refusing is fair while the zombie holds the pid (postgres's own
	// interlock), but the error must say what is in the way — the stale
	// postmaster.pid — not tell the user to delete the whole cluster.
	require.Contains(t, err.Error(), "postmaster.pid", "the error names the stale lock file")
	require.NotContains(t, err.Error(), "remove "+cluster+" ", "the error does not advise deleting the cluster: %v", err)
}

// A port that is taken (`engine devstack --postgres-port P`, P in use) is
// named as the cause; the start must not tell the user to delete the
// cluster, which holds every dev database.
func TestAPostgresPortInUseIsNamed(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	dataDir := filepath.Join(parent, "data")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port

	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Port: port, Settings: map[string]string{"fsync": "off"}})
	if err == nil {
		_ = pg.Stop(ctx)
	}
	cluster, _ := clusterDirFor(dataDir, mustServerUser(t))
	t.Cleanup(func() { _ = os.RemoveAll(cluster); _ = os.RemoveAll(parent) })
	require.Error(t, err)
	require.Contains(t, err.Error(), strconv.Itoa(port), "the error names the port in use")
	require.NotContains(t, err.Error(), "remove "+cluster+" ", "the error does not advise deleting the cluster: %v", err)
}

func mustServerUser(t *testing.T) *syscall.Credential {
	runAs, err := serverUser()
	require.NoError(t, err)
	return runAs
}

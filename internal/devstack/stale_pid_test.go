package devstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stalePidFile writes the postmaster.pid a server that died without a
// shutdown (a host reboot, a container restart) leaves behind, naming pid
// and port.
func stalePidFile(t *testing.T, cluster string, pid, port int) {
	t.Helper()
	pidFile := fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n127.0.0.1\n        0         0\nready   \n", pid, cluster, time.Now().Unix(), port, cluster)
	require.NoError(t, os.WriteFile(filepath.Join(cluster, "postmaster.pid"), []byte(pidFile), 0o600))
	if runAs := mustServerUser(t); runAs != nil {
		require.NoError(t, os.Chown(filepath.Join(cluster, "postmaster.pid"), int(runAs.Uid), int(runAs.Gid)))
	}
}

// unrelatedProcess is a live process that is no postmaster (after a reboot
// the stale pid names whatever got that pid since).
func unrelatedProcess(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// After a reboot the postmaster.pid of a server that died names a pid the
// system gave to an unrelated process since. RemoveDataDir already tells
// that case apart (runsIn); StartPostgres takes the pid for a live
// postmaster and refuses to start the cluster.
func TestAStalePostmasterPidNamingAnUnrelatedLiveProcessStillStarts(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	dataDir := filepath.Join(parent, "data")
	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	cluster, port := pg.ClusterDir(), pg.Port()
	t.Cleanup(func() { _ = os.RemoveAll(cluster); _ = os.RemoveAll(parent) })
	require.NoError(t, pg.Stop(ctx))

	other := unrelatedProcess(t)
	stalePidFile(t, cluster, other.Process.Pid, port)

	again, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	require.NoError(t, err, "the cluster starts: its postmaster.pid names a process that is no postmaster of it")
	t.Cleanup(func() { _ = again.Stop(context.Background()) })
	require.False(t, again.Reused())
}

// Worse, when the stale pid file's port is served by another cluster (a
// second data dir's `engine dev`), the start "reuses" that other cluster,
// adopts the unrelated process as its postmaster, and Stop signals it.
func TestAStalePostmasterPidIsNotAdoptedAndItsProcessNotSignalled(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	dataDir := filepath.Join(parent, "data")
	otherDir := filepath.Join(parent, "other")
	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	cluster := pg.ClusterDir()
	require.NoError(t, pg.Stop(ctx))
	otherPG, err := StartPostgres(ctx, PostgresOptions{DataDir: otherDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = otherPG.Stop(context.Background())
		_ = os.RemoveAll(otherPG.ClusterDir())
		_ = os.RemoveAll(cluster)
		_ = os.RemoveAll(parent)
	})

	victim := unrelatedProcess(t)
	stalePidFile(t, cluster, victim.Process.Pid, otherPG.Port())
	// (the engine dev that started this cluster is gone since the reboot)
	require.NoError(t, os.WriteFile(filepath.Join(cluster, "reveille.owner"), []byte(strconv.Itoa(zombie(t))), 0o644))

	again, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
	servedPort := 0
	if err == nil {
		servedPort = again.Port()
		t.Logf("start: reused=%v port=%d (the other cluster's: %d)", again.Reused(), again.Port(), otherPG.Port())
		_ = again.Stop(ctx)
	}
	time.Sleep(200 * time.Millisecond)
	var ws syscall.WaitStatus
	wpid, _ := syscall.Wait4(victim.Process.Pid, &ws, syscall.WNOHANG, nil)
	if wpid != 0 {
		t.Errorf("Stop signalled the unrelated process the stale pid file named: it exited (%v)", ws)
	}
	require.NotEqual(t, otherPG.Port(), servedPort, "the start serves this data dir's cluster, not another's")
}

// An adopted postmaster that died while this process ran may have left its
// pid to another process by the time Stop comes: Stop signals only a
// process that runs in the cluster's directory.
func TestStopLeavesAnAdoptedPidThatIsNoLongerTheClustersPostmaster(t *testing.T) {
	other := unrelatedProcess(t)
	p := &Postgres{dataDir: t.TempDir(), adoptedPID: other.Process.Pid}
	require.NoError(t, p.stopAdopted(context.Background()))
	var ws syscall.WaitStatus
	wpid, err := syscall.Wait4(other.Process.Pid, &ws, syscall.WNOHANG, nil)
	require.NoError(t, err)
	require.Zero(t, wpid, "the unrelated process was signalled: %v", ws)
}

package devstack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const noPtraceHelperEnv = "REVEILLE_DEVSTACK_NOPTRACE_REUSE_DIR"

// As root in a container with Docker's default capabilities (no
// CAP_SYS_PTRACE), /proc/<pid>/cwd of the postmaster, which runs as the
// postgres user, cannot be read: runsIn then reports "not this cluster's"
// for the cluster's own live postmaster, and StartPostgres deletes its
// postmaster.pid and starts a second server on the same data directory
// instead of reusing it ("a Postgres left running by a killed run is
// reused"). Before f7d99e8 the live postmaster was reused.
func TestALivePostmasterIsReusedWhereItsCwdCannotBeRead(t *testing.T) {
	ctx := context.Background()
	if dir := os.Getenv(noPtraceHelperEnv); dir != "" {
		// (the child, run without CAP_SYS_PTRACE)
		again, err := StartPostgres(ctx, PostgresOptions{DataDir: dir})
		require.NoError(t, err)
		defer func() { _ = again.Stop(ctx) }()
		require.True(t, again.Reused(), "the live postmaster of the cluster is reused")
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("as root only: the postmaster then runs as another user")
	}
	capsh, err := exec.LookPath("capsh")
	if err != nil {
		t.Skip("needs capsh to drop CAP_SYS_PTRACE")
	}
	parent, err := os.MkdirTemp("", "devstack-*")
	require.NoError(t, err)
	dataDir := filepath.Join(parent, "data")
	pg, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir, Settings: map[string]string{"fsync": "off"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = pg.Stop(context.Background())
		_ = os.RemoveAll(pg.ClusterDir())
		_ = os.RemoveAll(parent)
	})

	cmd := exec.Command(capsh, "--drop=cap_sys_ptrace", "--", "-c",
		`exec "$0" -test.count=1 -test.run '^TestALivePostmasterIsReusedWhereItsCwdCannotBeRead$'`, os.Args[0])
	cmd.Env = append(os.Environ(), noPtraceHelperEnv+"="+dataDir)
	out, err := cmd.CombinedOutput()
	log, _ := os.ReadFile(filepath.Join(pg.ClusterDir(), "server.log"))
	assert.NoError(t, err, "a second start without CAP_SYS_PTRACE:\n%s\nserver.log:\n%s", out, log)
	_, pid, live := livePostmaster(pg.ClusterDir())
	// (postgres itself shuts down within a minute once its lock file is
	// gone: "performing immediate shutdown because data directory lock
	// file is invalid")
	require.True(t, live, "the running postmaster's postmaster.pid is left in place")
	require.Equal(t, pg.cmd.Process.Pid, pid)
}

package devstack

import (
	"context"
	"io/fs"
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
// postgres user, cannot be read: runsIn then reported "not this cluster's"
// for the cluster's own live postmaster, and StartPostgres deleted its
// postmaster.pid and started a second server on the same data directory
// instead of reusing it ("a Postgres left running by a killed run is
// reused"). The live postmaster is now known by its command line.
//
// The unreadable cwd is made two ways: always by readCwd answering EACCES
// (a process of the test's own user cannot cause it otherwise); and, as
// root — as CI runs —, for real, by a second start in a child process that
// capsh runs without CAP_SYS_PTRACE (.ci/run installs capsh; its absence
// fails the test).
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
	start := func(t *testing.T) (*Postgres, string) {
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
		return pg, dataDir
	}
	requireKept := func(t *testing.T, pg *Postgres) {
		_, pid, live := livePostmaster(pg.ClusterDir())
		// (postgres itself shuts down within a minute once its lock file
		// is gone: "performing immediate shutdown because data directory
		// lock file is invalid")
		require.True(t, live, "the running postmaster's postmaster.pid is left in place")
		require.Equal(t, pg.cmd.Process.Pid, pid)
	}

	t.Run("cwd read refused", func(t *testing.T) {
		pg, dataDir := start(t)
		read := readCwd
		readCwd = func(int) (string, error) { return "", fs.ErrPermission }
		t.Cleanup(func() { readCwd = read })
		again, err := StartPostgres(ctx, PostgresOptions{DataDir: dataDir})
		require.NoError(t, err)
		require.True(t, again.Reused(), "the live postmaster of the cluster is reused")
		requireKept(t, pg)
	})

	if os.Geteuid() != 0 {
		t.Log("not root: the postmaster runs as this user, whose cwd it can read; the real case runs as root (CI)")
		return
	}
	t.Run("root without CAP_SYS_PTRACE", func(t *testing.T) {
		capsh, err := exec.LookPath("capsh")
		require.NoError(t, err, "capsh drops CAP_SYS_PTRACE for the second start (Debian: libcap2-bin; .ci/run installs it)")
		pg, dataDir := start(t)
		cmd := exec.Command(capsh, "--drop=cap_sys_ptrace", "--", "-c",
			`exec "$0" -test.count=1 -test.run '^TestALivePostmasterIsReusedWhereItsCwdCannotBeRead$'`, os.Args[0])
		cmd.Env = append(os.Environ(), noPtraceHelperEnv+"="+dataDir)
		out, err := cmd.CombinedOutput()
		log, _ := os.ReadFile(filepath.Join(pg.ClusterDir(), "server.log"))
		assert.NoError(t, err, "a second start without CAP_SYS_PTRACE:\n%s\nserver.log:\n%s", out, log)
		requireKept(t, pg)
	})
}

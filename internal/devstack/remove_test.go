package devstack

import (
	"bufio"
	"bytes"
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

// The test binary doubles as a test process that dies without cleaning up:
// run with helperDirEnv set, it locks that data dir, starts a cluster in it
// and prints the postmaster's pid and cluster dir, then waits to be killed.
const (
	helperDirEnv = "REVEILLE_DEVSTACK_HELPER_DIR"
	helperDieEnv = "REVEILLE_DEVSTACK_HELPER_DIE_WITH_PARENT"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperDirEnv); dir != "" {
		os.Exit(runHelper(dir, os.Getenv(helperDieEnv) == "1"))
	}
	os.Exit(m.Run())
}

func runHelper(dir string, dieWithParent bool) int {
	if _, err := LockDataDir(dir, "helper"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pg, err := StartPostgres(context.Background(), PostgresOptions{
		DataDir: dir, Settings: map[string]string{"fsync": "off"}, DieWithParent: dieWithParent,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d %s\n", pg.cmd.Process.Pid, pg.ClusterDir())
	time.Sleep(time.Hour) // until killed
	return 1
}

// killedProcess is what a helper that was killed left behind.
type killedProcess struct {
	pid, postmaster int
	clusterDir      string
}

// killedTestProcess runs the helper on dir and SIGKILLs it once its
// postmaster is up, as an interrupted or timed-out go test dies.
func killedTestProcess(t *testing.T, dir string, dieWithParent bool) killedProcess {
	t.Helper()
	var postmaster int
	var clusterDir string
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir, helperDieEnv+"="+map[bool]string{true: "1", false: "0"}[dieWithParent])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // stderr is complete only after Wait
		t.Fatalf("helper: %v: %s", err, stderr.String())
	}
	_, err = fmt.Sscanf(line, "%d %s", &postmaster, &clusterDir)
	require.NoError(t, err, line)
	t.Cleanup(func() {
		if !processGone(postmaster) {
			_ = syscall.Kill(postmaster, syscall.SIGQUIT)
		}
		for deadline := time.Now().Add(10 * time.Second); !processGone(postmaster) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		_ = os.RemoveAll(clusterDir)
	})

	// The lock is the helper's while it lives.
	_, err = LockDataDir(dir, "test")
	var inUse *DataDirInUseError
	require.ErrorAs(t, err, &inUse)
	require.Equal(t, cmd.Process.Pid, inUse.PID)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	return killedProcess{pid: cmd.Process.Pid, postmaster: postmaster, clusterDir: clusterDir}
}

func TestRemoveAbandonedRemovesOnlyTheDataDirsOfDeadProcesses(t *testing.T) {
	parent := t.TempDir()
	path := func(name string) string { return filepath.Join(parent, name) }
	writeLock := func(dir, content string) {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, LockFileName), []byte(content), 0o644))
	}

	// A killed test process whose postmaster outlived it.
	killed := killedTestProcess(t, path("reveille-test-killed"), false)
	require.False(t, processGone(killed.postmaster))

	// A dead process's dir whose postmaster.pid names a pid since reused by
	// an unrelated live process: that process must not be signalled.
	unrelated := exec.Command("sleep", "300")
	require.NoError(t, unrelated.Start())
	t.Cleanup(func() { _ = unrelated.Process.Kill(); _ = unrelated.Wait() })
	writeLock(path("reveille-test-stale-pid"), "999999 e2e.test\n")
	require.NoError(t, os.MkdirAll(path("reveille-test-stale-pid/postgres"), 0o700))
	require.NoError(t, os.WriteFile(path("reveille-test-stale-pid/postgres/postmaster.pid"),
		[]byte(strconv.Itoa(unrelated.Process.Pid)+"\n/x\n1700000000\n5432\n"), 0o600))

	live, err := LockDataDir(path("reveille-test-live"), "live.test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = live.Release() })
	writeLock(path("reveille-test-being-created"), "") // its creator is about to lock it
	require.NoError(t, os.MkdirAll(path("reveille-test-never-locked"), 0o755))
	writeLock(path("other-abandoned"), "999999 other\n") // not matched by the pattern

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	removed, err := RemoveAbandoned(ctx, filepath.Join(parent, "reveille-test-*"))
	require.NoError(t, err)
	require.ElementsMatch(t, []Abandoned{
		{Dir: path("reveille-test-killed"), Holder: strconv.Itoa(killed.pid) + " helper"},
		{Dir: path("reveille-test-stale-pid"), Holder: "999999 e2e.test"},
	}, removed)

	cases := []struct {
		dir  string
		kept bool
	}{
		{path("reveille-test-killed"), false},
		{killed.clusterDir, false},
		{path("reveille-test-stale-pid"), false},
		{path("reveille-test-live"), true},
		{path("reveille-test-being-created"), true},
		{path("reveille-test-never-locked"), true},
		{path("other-abandoned"), true},
	}
	for _, tc := range cases {
		_, err := os.Stat(tc.dir)
		require.Equal(t, tc.kept, err == nil, "%s kept: %v (stat: %v)", tc.dir, tc.kept, err)
	}
	require.True(t, processGone(killed.postmaster), "the abandoned postmaster is stopped")
	require.False(t, processGone(unrelated.Process.Pid), "the unrelated process is left alone")
}

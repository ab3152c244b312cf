package devstack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ServerLog is the server log of the cluster dataDir's Postgres runs in,
// wherever clusterDirFor put it ("" when there is none).
func ServerLog(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return ""
	}
	for _, cluster := range []string{filepath.Join(abs, "postgres"), tempClusterDir(abs)} {
		if p := filepath.Join(cluster, "server.log"); fileExists(p) {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// RemoveDataDir stops a postmaster still running on dataDir's cluster
// (immediate shutdown: the data is about to go) and removes the cluster,
// also one clusterDirFor put under the temp dir, and dataDir itself. It is
// for disposable data dirs, such as those of test processes that died; the
// caller holds dataDir's lock. A cluster whose postmaster does not stop is
// left in place, and the error says so.
func RemoveDataDir(ctx context.Context, dataDir string) error {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, cluster := range []string{filepath.Join(abs, "postgres"), tempClusterDir(abs)} {
		if err := stopStrandedPostmaster(ctx, cluster); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(cluster); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(abs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stopStrandedPostmaster stops the postmaster that clusterDir's
// postmaster.pid names, if it is alive and really runs that cluster, and
// waits for it to exit.
func stopStrandedPostmaster(ctx context.Context, clusterDir string) error {
	_, pid, ok := livePostmaster(clusterDir)
	if !ok || !runsIn(pid, clusterDir) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown: backends go too
	for !processGone(pid) {
		if ctx.Err() != nil {
			return fmt.Errorf("postmaster %d of %s did not stop: %w", pid, clusterDir, ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// readCwd reads process pid's working directory (a variable: a test of a
// process of its own user cannot make the read fail with EACCES, as root
// without CAP_SYS_PTRACE meets it for the postgres user's postmaster).
var readCwd = func(pid int) (string, error) { return os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd") }

// runsIn reports whether process pid's working directory is dir, as a
// postmaster's is its cluster's: a postmaster.pid left by a server that died
// may name a pid the system has since given to an unrelated process. Without
// /proc there is no telling, and the pid is trusted as pg_ctl trusts it.
func runsIn(pid int, dir string) bool {
	cwd, err := readCwd(pid)
	if errors.Is(err, fs.ErrPermission) {
		// (another user's process, and no CAP_SYS_PTRACE — root in a
		// container: its command line, world-readable, names the cluster
		// it was started on: "postgres -D <dir> …")
		return startedOn(pid, dir)
	}
	if err != nil {
		_, noProc := os.Stat("/proc/self")
		return noProc != nil
	}
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	return cwd == want
}

// startedOn reports whether process pid's command line has "-D dir".
func startedOn(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-D" && filepath.Clean(args[i+1]) == filepath.Clean(dir) {
			return true
		}
	}
	return false
}

// Abandoned is a data dir RemoveAbandoned removed.
type Abandoned struct {
	Dir    string
	Holder string // the lock file's "pid holder" of the process that died
}

// RemoveAbandoned removes the data dirs matching pattern (a filepath.Glob
// pattern) whose lock a process held and no longer holds, with their
// clusters (LockAbandonedDataDir, RemoveDataDir): what test processes
// killed before their cleanup ran leave behind. Directories that are in
// use, being created, or never locked are left alone. It returns what it
// removed, and the errors of what it could not.
func RemoveAbandoned(ctx context.Context, pattern string) ([]Abandoned, error) {
	dirs, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	var removed []Abandoned
	var errs []error
	for _, dir := range dirs {
		lock, holder, ok := LockAbandonedDataDir(dir)
		if !ok {
			continue
		}
		err := RemoveDataDir(ctx, dir)
		_ = lock.Release() // after the removal, so no second reaper starts on it meanwhile
		if err != nil {
			errs = append(errs, fmt.Errorf("remove abandoned %s: %w", dir, err))
			continue
		}
		removed = append(removed, Abandoned{Dir: dir, Holder: holder})
	}
	return removed, errors.Join(errs...)
}

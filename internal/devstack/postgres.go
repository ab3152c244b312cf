// Package devstack starts the real infrastructure Reveille needs on a
// developer's machine or in a test process: a local PostgreSQL cluster run
// from the machine's server binaries. The embedded Temporal dev server lives
// in the subpackage devtemporal, so that code needing only Postgres does not
// link the Temporal server. A data directory is used by one process at a
// time (LockDataDir); RemoveAbandoned clears those of processes that died.
package devstack

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPostgres is returned when no PostgreSQL server binaries can be found.
var ErrNoPostgres = errors.New("no PostgreSQL server binaries found (initdb, postgres): install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL")

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// DataDir is where the cluster lives (the cluster itself goes in
	// DataDir/postgres). It is reused across runs. Required.
	DataDir string
	// Port to listen on at 127.0.0.1; 0 picks a free one (a reused live
	// postmaster keeps its own port).
	Port int
	// Settings are extra `-c name=value` server settings (tests turn fsync off).
	Settings map[string]string
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// DieWithParent stops a server this call starts when this process dies,
	// however it dies (Linux only): for disposable clusters such as tests'.
	// Off, a server outlives a killed process and the next run reuses it.
	DieWithParent bool
}

// Postgres is a running (or reused) local cluster.
type Postgres struct {
	binDir  string
	dataDir string // cluster directory (PGDATA)
	port    int
	cmd     *exec.Cmd // nil when a live postmaster was reused
	done    chan struct{}
	reused  bool
	// adoptedPID is a reused postmaster whose starter is dead: this process
	// owns it now and stops it on Stop.
	adoptedPID int
	ownerFile  string
	logger     *slog.Logger
	// logPath is the server's log; waitErr how the server started here
	// ended (set before done closes)
	logPath string
	waitErr error
}

// Exited says how a server started here ended, and where its log is, once
// Wait's channel is closed.
func (p *Postgres) Exited() error {
	return fmt.Errorf("postgres exited (%v): its log is %s", p.waitErr, p.logPath)
}

// Port is the TCP port the server listens on at 127.0.0.1.
func (p *Postgres) Port() int { return p.port }

// ClusterDir is the cluster's data directory (PGDATA).
func (p *Postgres) ClusterDir() string { return p.dataDir }

// Reused reports whether a postmaster left alive by an earlier run was reused.
func (p *Postgres) Reused() bool { return p.reused }

// URL is a connection string for database dbname as the superuser postgres.
func (p *Postgres) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, dbname)
}

// FindBinaries returns the directory holding initdb and postgres: from PATH,
// else the newest /usr/lib/postgresql/<version>/bin.
func FindBinaries() (string, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(initdb)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// StartPostgres starts a cluster under opts.DataDir, creating it on first use,
// or reuses a postmaster that an earlier (perhaps killed) run left alive.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	runAs, err := serverUser()
	if err != nil {
		return nil, err
	}
	clusterDir, err := clusterDirFor(opts.DataDir, runAs)
	if err != nil {
		return nil, err
	}
	p := &Postgres{binDir: binDir, dataDir: clusterDir, logger: logger, ownerFile: filepath.Join(clusterDir, "reveille.owner")}

	livePort, pid, live := livePostmaster(clusterDir)
	if live && !runsIn(pid, clusterDir) {
		// A postmaster.pid left by a server that died (a reboot, a
		// container restart) names a pid the system has given to an
		// unrelated process since: no server of this cluster runs, and
		// postgres would refuse the file while that pid lives.
		logger.Info("removing a stale postmaster.pid naming a process that is no postmaster of this cluster", "dir", clusterDir, "pid", pid)
		if err := os.Remove(filepath.Join(clusterDir, "postmaster.pid")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale %s: %w", filepath.Join(clusterDir, "postmaster.pid"), err)
		}
		live = false
	}
	if live {
		p.port, p.reused = livePort, true
		if err := p.waitReady(ctx, 10*time.Second); err != nil {
			return nil, fmt.Errorf("postmaster %d in %s (port %d) is alive but does not answer (%w); if no postgres runs for this directory, remove %s",
				pid, clusterDir, livePort, err, filepath.Join(clusterDir, "postmaster.pid"))
		}
		// A postmaster whose starter was killed is adopted: this process
		// stops it on exit. One whose starter still runs is left to it.
		if processGone(readPID(p.ownerFile)) {
			p.adoptedPID = pid
			p.writeOwner()
		}
		logger.Info("reusing live postmaster", "dir", clusterDir, "port", livePort, "adopted", p.adoptedPID != 0)
		return p, nil
	}

	// A postmaster that exited unreaped (a zombie, which livePostmaster
	// counts as dead) still holds its pid: postgres refuses its lock file.
	pidFile := filepath.Join(clusterDir, "postmaster.pid")
	if b, err := os.ReadFile(pidFile); err == nil {
		first, _, _ := strings.Cut(string(b), "\n")
		if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && processAlive(pid) && processGone(pid) {
			return nil, fmt.Errorf("postmaster %d of %s has exited but was not reaped (its parent does not reap children), and postgres refuses %s while the pid exists: "+
				"once no postgres process of this cluster is left, remove %s", pid, clusterDir, pidFile, pidFile)
		}
	}
	if _, err := os.Stat(filepath.Join(clusterDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		logger.Info("initializing postgres cluster", "dir", clusterDir)
		if err := p.run(ctx, runAs, filepath.Join(binDir, "initdb"), "-D", clusterDir, "-U", "postgres",
			"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
			return nil, fmt.Errorf("initdb: %w", err)
		}
	}

	port := opts.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	} else if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
		return nil, fmt.Errorf("port %d on 127.0.0.1 is not available (is another postgres running?): %w", port, err)
	} else {
		l.Close()
	}
	args := []string{"-D", clusterDir, "-p", strconv.Itoa(port), "-k", clusterDir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300"}
	names := make([]string, 0, len(opts.Settings))
	for name := range opts.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		args = append(args, "-c", name+"="+opts.Settings[name])
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // our Ctrl-C goes to us; we stop postgres ourselves
	if runAs != nil {
		cmd.SysProcAttr.Credential = runAs
	}
	if opts.DieWithParent {
		dieWithParent(cmd.SysProcAttr)
	}
	p.logPath = filepath.Join(clusterDir, "server.log")
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := startServer(cmd, logFile, p); err != nil {
		return nil, err
	}
	p.port = port
	p.writeOwner()
	if err := p.waitReady(ctx, 60*time.Second); err != nil {
		_ = p.Stop(context.Background())
		return nil, fmt.Errorf("postgres did not become ready (see %s; if this directory's first initdb was interrupted, remove %s to create the cluster again): %w",
			filepath.Join(clusterDir, "server.log"), clusterDir, err)
	}
	logger.Info("postgres started", "dir", clusterDir, "port", port)
	return p, nil
}

// startServer starts cmd and waits on it in a goroutine locked to the OS
// thread that started it. The parent-death signal (DieWithParent) fires
// when that thread exits, not the process; started from any thread, the
// server would be stopped the day some goroutine locks that thread and
// exits without unlocking it, for the runtime then ends the thread.
func startServer(cmd *exec.Cmd, logFile *os.File, p *Postgres) error {
	started := make(chan error)
	p.done = make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			logFile.Close()
			started <- fmt.Errorf("start postgres: %w", err)
			return
		}
		p.cmd = cmd
		started <- nil
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return <-started
}

// EnsureDatabase creates database name if it does not exist.
func (p *Postgres) EnsureDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" {
			return nil // another process created it meanwhile
		}
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down (fast shutdown) if this process started or
// adopted it. A postmaster reused from a live starter is left running: it
// belongs to that process.
func (p *Postgres) Stop(ctx context.Context) error {
	if p.adoptedPID != 0 {
		return p.stopAdopted(ctx)
	}
	if p.cmd == nil || p.cmd.Process == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("postgres did not stop within 30s; killed")
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.done
		return ctx.Err()
	}
}

// Wait returns a channel closed when a server this process started exits.
func (p *Postgres) Wait() <-chan struct{} {
	if p.done == nil {
		return make(chan struct{})
	}
	return p.done
}

func (p *Postgres) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var lastErr error
	for time.Now().Before(deadline) {
		if p.done != nil {
			select {
			case <-p.done:
				return errors.New("postgres exited during start")
			default:
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, p.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return lastErr
}

func (p *Postgres) run(ctx context.Context, runAs *syscall.Credential, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	// On Ctrl-C initdb gets SIGINT (and removes what it made) rather than
	// SIGKILL, which would leave a half-made cluster behind.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
		cmd.Dir = "/"
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// serverUser is the account to run initdb/postgres as: nil (ourselves) unless
// we are root, which PostgreSQL refuses; then the postgres system user.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root: need the 'postgres' system user (apt-get install postgresql creates it): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// clusterDirFor picks the cluster directory: dataDir/postgres, owned by the
// server user. When that user cannot reach dataDir (a root-owned 0700 temp
// dir), the cluster goes to a directory of its own under the system temp dir,
// named after dataDir so the next run finds it again.
func clusterDirFor(dataDir string, runAs *syscall.Credential) (string, error) {
	if dataDir == "" {
		return "", errors.New("devstack: DataDir is required")
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("create data dir: %w", err)
	}
	dir := filepath.Join(abs, "postgres")
	if runAs == nil {
		return dir, os.MkdirAll(dir, 0o700)
	}
	if reachable(abs, int(runAs.Uid), int(runAs.Gid)) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", err
		}
		return dir, os.Chown(dir, int(runAs.Uid), int(runAs.Gid))
	}
	dir = tempClusterDir(abs)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chown(dir, int(runAs.Uid), int(runAs.Gid)); err != nil {
		return "", err
	}
	// Leave a pointer so a human finds the cluster.
	_ = os.WriteFile(filepath.Join(abs, "postgres.location"), []byte(dir+"\n"), 0o644)
	return dir, nil
}

// tempClusterDir is where clusterDirFor puts the cluster of the data dir abs
// when the server user cannot reach abs.
func tempClusterDir(abs string) string {
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(os.TempDir(), "reveille-pg-"+hex.EncodeToString(sum[:8]))
}

// reachable reports whether uid/gid can traverse every directory down to dir.
func reachable(dir string, uid, gid int) bool {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		mode := fi.Mode().Perm()
		switch {
		case int(st.Uid) == uid:
			if mode&0o100 == 0 {
				return false
			}
		case int(st.Gid) == gid:
			if mode&0o010 == 0 {
				return false
			}
		default:
			if mode&0o001 == 0 {
				return false
			}
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// stopAdopted stops an adopted postmaster by signal (it is not our child,
// so we watch its pid instead of waiting on it).
func (p *Postgres) stopAdopted(ctx context.Context) error {
	pid := p.adoptedPID
	p.adoptedPID = 0
	if !runsIn(pid, p.dataDir) {
		return nil // gone, and its pid perhaps another process's since
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		return nil // already gone
	}
	deadline := time.Now().Add(30 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return errors.New("adopted postgres did not stop in time; killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// writeOwner records this process as the cluster's owner (best effort: the
// file lives in the cluster dir, which may belong to the postgres user).
func (p *Postgres) writeOwner() {
	_ = os.WriteFile(p.ownerFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// processGone reports whether pid has exited: no such process, or a zombie
// (an orphan whose reaper has not collected it yet; in a container whose
// first process does not reap, never).
func processGone(pid int) bool {
	if !processAlive(pid) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S …": the state follows the last ')'; comm may hold any byte.
	_, rest, ok := strings.Cut(string(b[strings.LastIndexByte(string(b), ')')+1:]), " ")
	return ok && strings.HasPrefix(rest, "Z")
}

// livePostmaster reads postmaster.pid and reports the port and pid of a
// live server.
func livePostmaster(clusterDir string) (port, pid int, ok bool) {
	f, err := os.Open(filepath.Join(clusterDir, "postmaster.pid"))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 {
		return 0, 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return 0, 0, false
	}
	port, err = strconv.Atoi(strings.TrimSpace(lines[3]))
	if err != nil || processGone(pid) {
		return 0, 0, false
	}
	return port, pid, true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

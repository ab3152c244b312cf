//go:build faults

package faults

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgdevstack "github.com/reveille/reveille/internal/devstack"
)

// The shared infrastructure: the engine binary and the two devstacks.
var (
	engineBin string
	workDir   string
	pgStack   *devstack
	tempStack *devstack
)

// devstack is one `engine devstack --only <part>` process, restartable on
// the same data directory and port.
type devstack struct {
	part    string // postgres or temporal
	dataDir string
	port    int // fixed after the first start
	addr    string
	p       *proc
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	began := time.Now()
	var err error
	if workDir, err = os.MkdirTemp("", "reveille-faults-"); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	// Logs stay for a failed run; everything else is removed (below).
	if err := buildEngine(); err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	fmt.Printf("faults: engine built in %s\n", time.Since(began).Round(time.Second))
	pgStack = &devstack{part: "postgres", dataDir: filepath.Join(workDir, "pg")}
	tempStack = &devstack{part: "temporal", dataDir: filepath.Join(workDir, "temporal")}
	for _, d := range []*devstack{pgStack, tempStack} {
		if err := d.start(); err != nil {
			fmt.Fprintln(os.Stderr, "faults:", err)
			pgStack.stop()
			tempStack.stop()
			return 1
		}
	}
	code := m.Run()
	tempStack.stop()
	pgStack.stop()
	if code != 0 {
		// (the Postgres server's own log, beside the processes' logs)
		if log := pgdevstack.ServerLog(pgStack.dataDir); log != "" {
			if b, err := os.ReadFile(log); err == nil {
				_ = os.WriteFile(filepath.Join(workDir, "postgres-server.log"), b, 0o644)
			}
		}
	}
	// Everything but the logs goes, after a failed run too (it kept the
	// engine binary, Temporal's data and the cluster: ~240 MB a run, the
	// cluster outside workDir). The Postgres devstack's cluster may live
	// outside workDir (in /tmp/reveille-pg-…, when the server's user
	// cannot reach workDir, as under root): RemoveDataDir removes it too,
	// where RemoveAll left 150 MB behind per run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := pgdevstack.RemoveDataDir(ctx, pgStack.dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "faults: removing the Postgres devstack's data:", err)
		code = 1
	}
	cancel()
	_ = os.Remove(engineBin)
	_ = os.RemoveAll(tempStack.dataDir)
	if code == 0 {
		_ = os.RemoveAll(workDir)
	} else {
		fmt.Printf("faults: logs kept in %s\n", workDir)
	}
	fmt.Printf("faults: suite took %s\n", time.Since(began).Round(time.Second))
	return code
}

// buildEngine builds cmd/engine once, with the fault hooks and without
// -race (the replicas are many and the machine small).
func buildEngine() error {
	engineBin = filepath.Join(workDir, "engine")
	cmd := exec.Command("go", "build", "-tags", "faults", "-o", engineBin, "github.com/reveille/reveille/cmd/engine")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build cmd/engine: %w", err)
	}
	return nil
}

// start starts the devstack and waits for the line that names its
// address; the first start picks a free port, later ones reuse it.
func (d *devstack) start() error {
	args := []string{"devstack", "--only", d.part, "--data-dir", d.dataDir}
	prefix := "DATABASE_URL="
	if d.part == "postgres" {
		args = append(args, "--postgres-port", strconv.Itoa(d.port))
	} else {
		args = append(args, "--temporal-port", strconv.Itoa(d.port))
		prefix = "TEMPORAL_ADDRESS="
	}
	logPath := filepath.Join(workDir, fmt.Sprintf("devstack-%s.log", d.part))
	p, err := startProc("devstack "+d.part, logPath, []string{"REVEILLE_LOG_LEVEL=warn"}, syscall.SIGTERM, engineBin, args...)
	if err != nil {
		return err
	}
	d.p = p
	addr, err := p.waitLine(prefix, 3*time.Minute)
	if err != nil {
		p.kill()
		return err
	}
	d.addr = addr
	if d.part == "postgres" {
		u, err := url.Parse(addr)
		if err != nil {
			return err
		}
		addr = u.Host
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("devstack %s printed %q: %w", d.part, d.addr, err)
	}
	d.port, _ = strconv.Atoi(port)
	return nil
}

// stop stops the devstack gracefully (Postgres: a fast shutdown, which
// ends every connection).
func (d *devstack) stop() {
	if d.p != nil && !d.p.exited() {
		_ = d.p.stop(time.Minute)
	}
}

// up reports whether the devstack runs.
func (d *devstack) up() bool { return d.p != nil && !d.p.exited() }

// pgURL is the URL of database name on the shared Postgres.
func pgURL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pgStack.port, name)
}

// createDatabase makes a fresh database for one test.
func createDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, pgURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}

// Package testkit is the test harness: one real PostgreSQL server per test
// process (started in TestMain) and a fresh, migrated database per test.
// Temporal for tests lives in the subpackage temporalkit, so only the
// end-to-end package links the Temporal server.
package testkit

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for pgtestdb
	"github.com/peterldowns/pgtestdb"

	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/migrations"
)

var (
	serverMu   sync.Mutex
	serverURL  string
	server     *devstack.Postgres
	serverDir  string
	serverLock *devstack.DataDirLock
)

// testDirPattern names the temporary data dir of each test process's
// cluster, under os.TempDir().
const testDirPattern = "reveille-test-*"

// Main runs a test binary with a PostgreSQL server: the one named by
// REVEILLE_TEST_DATABASE_URL if set, else a fresh cluster started from the
// machine's binaries (fsync off: test data is disposable). Use it as
//
//	func TestMain(m *testing.M) { testkit.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit, for a TestMain that starts more around the
// tests; it returns the tests' exit code.
func Run(m *testing.M) int {
	if err := startServer(); err != nil {
		fmt.Fprintln(os.Stderr, "testkit:", err)
		return 1
	}
	defer stopServer()
	return m.Run()
}

func startServer() error {
	serverMu.Lock()
	defer serverMu.Unlock()
	if u := os.Getenv("REVEILLE_TEST_DATABASE_URL"); u != "" {
		serverURL = u
		return nil
	}
	reapAbandoned()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", testDirPattern)
	if err != nil {
		return err
	}
	// Held until the directory is gone: while it is, no other test
	// process's reapAbandoned touches the directory.
	lock, err := devstack.LockDataDir(dir, filepath.Base(os.Args[0]))
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{
		DataDir: dir,
		Settings: map[string]string{
			"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
			"max_connections": "500", "shared_buffers": "64MB",
		},
		DieWithParent: true,
	})
	if err != nil {
		_ = devstack.RemoveDataDir(ctx, dir)
		_ = lock.Release()
		return err
	}
	server, serverDir, serverURL, serverLock = pg, dir, pg.URL("postgres"), lock
	return nil
}

// reapAbandoned removes the clusters of test processes that died before
// their cleanup ran (an interrupted or timed-out go test): their servers
// die with them (DieWithParent) where the OS allows, their directories
// stay until this.
func reapAbandoned() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	removed, err := devstack.RemoveAbandoned(ctx, filepath.Join(os.TempDir(), testDirPattern))
	for _, r := range removed {
		fmt.Fprintf(os.Stderr, "testkit: removed %s, left by a test process that died (%s)\n", r.Dir, r.Holder)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testkit:", err)
	}
}

func stopServer() {
	serverMu.Lock()
	defer serverMu.Unlock()
	if server != nil {
		_ = server.Stop(context.Background())
		// Bounded: RemoveDataDir waits for a postmaster that Stop left running.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = devstack.RemoveDataDir(ctx, serverDir)
		cancel()
		_ = serverLock.Release()
		server = nil
	}
}

// ServerURL is the connection string of the test process's server
// (database postgres, superuser). Fails the test when Main did not run.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverMu.Lock()
	defer serverMu.Unlock()
	if serverURL == "" {
		t.Fatal("testkit: no PostgreSQL server; call testkit.Main(m) from TestMain")
	}
	return serverURL
}

// NewDatabase creates a fresh database with every migration applied (cloned
// from a template, so it is fast) and returns its connection string. It is
// dropped when the test passes.
func NewDatabase(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(ServerURL(t))
	if err != nil {
		t.Fatalf("testkit: parse server url: %v", err)
	}
	pw, _ := u.User.Password()
	conf := pgtestdb.Config{
		DriverName: "pgx",
		Host:       u.Hostname(),
		Port:       u.Port(),
		User:       u.User.Username(),
		Password:   pw,
		Database:   u.Path[1:],
		Options:    "sslmode=disable",
		// Tests use LISTEN/NOTIFY and advisory locks, nothing that needs a
		// superuser; the default role keeps them honest about that.
		TestRole: nil,
	}
	got := pgtestdb.Custom(t, conf, migrator{})
	return got.URL()
}

// NewPool returns a pgx pool on a fresh migrated database, closed at the end
// of the test.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewPoolFor(t, NewDatabase(t))
}

// NewTracedPool is NewPool with tracer (a RoundTrips, say) watching every
// statement its connections send.
func NewTracedPool(t testing.TB, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	return newPool(t, NewDatabase(t), tracer)
}

// NewPoolFor opens a pgx pool on dsn, closed at the end of the test.
func NewPoolFor(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, dsn, nil)
}

func newPool(t testing.TB, dsn string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testkit: parse dsn: %v", err)
	}
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testkit: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrator applies the embedded migrations; its hash is the migrations'
// content, so a changed migration gets a new template database.
type migrator struct{}

func (migrator) Hash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.Files(), path)
		if err != nil {
			return err
		}
		h.Write([]byte(path + "\x00" + strconv.Itoa(len(b)) + "\x00"))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func (migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := migrations.Up(ctx, db, nil)
	return err
}

// Package bench holds the `engine bench` benchmarks: pool (burn-down),
// spend, streams, wake (latency beside a bare Temporal signal) and rest (a
// REST route's rate beside whoami's). Each
// builds the engine through internal/service, as serve does, on a fresh
// database of its own that it drops at the end, so that runs share no rows
// and no benchmark writes into a domain table behind its package's back.
// cmd/engine parses the flags and the environment and hands each its
// Config.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/devstack/localstack"
	"github.com/reveille/reveille/internal/service"
)

// where is one run's infrastructure: a fresh database, and Temporal when
// the benchmark needs it, each either given (DATABASE_URL,
// TEMPORAL_ADDRESS) or started here.
type where struct {
	databaseURL string // the run's own database
	temporal    string // Temporal frontend ("" when not asked for)

	admin, database string // the connection the database was created from, and its name
	stack           *localstack.Stack
	tempDir         string // a temporary data dir this run made ("" when none)
}

// setUp gives a run of benchmark name its database — created beside the
// database of cfg.DatabaseURL, or in a local Postgres at its durable
// defaults (fsync and synchronous commit on) when that is empty — and,
// withTemporal, Temporal: cfg.TemporalAddress, or an embedded server. What
// starts here lives in dataDir (a temporary directory when empty). On
// error the returned where, if any, still needs tearDown.
func setUp(ctx context.Context, cfg service.Config, name, dataDir string, withTemporal bool) (*where, error) {
	w := &where{admin: cfg.DatabaseURL, temporal: cfg.TemporalAddress}
	startPostgres, startTemporal := cfg.DatabaseURL == "", withTemporal && cfg.TemporalAddress == ""
	if startPostgres || startTemporal {
		if dataDir == "" {
			dir, err := os.MkdirTemp("", "reveille-bench-"+name+"-*")
			if err != nil {
				return nil, err
			}
			dataDir, w.tempDir = dir, dir
		}
		st, err := localstack.Start(ctx, localstack.Options{
			DataDir: dataDir, Postgres: startPostgres, Temporal: startTemporal, Namespace: cfg.Namespace, Holder: "engine bench " + name,
		})
		if err != nil {
			return w, err
		}
		w.stack = st
		w.admin = cmp.Or(st.DatabaseURL(), w.admin)
		w.temporal = cmp.Or(st.TemporalAddress(), w.temporal)
		if startPostgres {
			fmt.Fprintf(os.Stderr, "bench: local Postgres at %s\n", w.admin)
		}
	}
	if !withTemporal {
		w.temporal = ""
	}
	var err error
	w.database, w.databaseURL, err = createDatabase(ctx, w.admin, name)
	return w, err
}

// tearDown drops the run's database and stops and removes what setUp
// started; keep leaves the database and the temporary directory in place.
func (w *where) tearDown(keep bool) {
	if w == nil {
		return // setUp failed before it made anything
	}
	if w.database != "" && !keep {
		if err := dropDatabase(w.admin, w.database); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}
	if w.stack != nil {
		w.stack.Stop()
	}
	if w.tempDir != "" && !keep {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = devstack.RemoveDataDir(ctx, w.tempDir)
	}
	if keep {
		fmt.Fprintf(os.Stderr, "bench: keeping database %s\n", w.database)
		if w.tempDir != "" {
			fmt.Fprintf(os.Stderr, "bench: keeping %s\n", w.tempDir)
		}
	}
}

// createDatabase creates an empty database named after the benchmark,
// beside adminURL's, and returns its name and connection string; the
// service migrates it when it starts.
func createDatabase(ctx context.Context, adminURL, bench string) (name, dsn string, err error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name = "bench_" + bench + "_" + hex.EncodeToString(suffix)
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", "", fmt.Errorf("connecting to create the run's database: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("creating the run's database (the role needs CREATEDB): %w", err)
	}
	dsn, err = withDatabase(adminURL, name)
	return name, dsn, err
}

// dropDatabase drops the run's database, closing any connection still
// open to it.
func dropDatabase(adminURL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connecting to drop database %s: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	return nil
}

// withDatabase is dsn naming database name instead: a URL gets name as its
// path; a keyword/value string gets a dbname that overrides any earlier
// one (the last keyword wins).
func withDatabase(dsn, name string) (string, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " dbname=" + name, nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	u.Path, u.RawPath = "/"+name, ""
	// A dbname in the query wins over the path (pgx, as libpq): kept, the
	// benchmark would migrate and write into the database it names.
	q := u.Query()
	if q.Has("dbname") || q.Has("database") {
		q.Del("dbname")
		q.Del("database")
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

// serviceConfig is base as one run's service: on the run's database and
// Temporal, with an API on a free local port that takes tokens signed
// with the returned secret, and no Temporal worker unless the benchmark
// adds one.
func serviceConfig(base service.Config, w *where, logger *slog.Logger) (service.Config, []byte) {
	c := base
	c.DatabaseURL, c.TemporalAddress, c.Logger, c.Worker = w.databaseURL, w.temporal, logger, nil
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	c.API.Addr, c.API.Auth = "127.0.0.1:0", api.AuthConfig{Secrets: [][]byte{secret}}
	// The probes and /metrics on that API (the rest bench reads its
	// histograms there), not on an ops address of the environment's.
	c.API.OpsAddr = ""
	return c, secret
}

// running is a service run in the background.
type running struct {
	addr   string // the API's address
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // what Run returned, once done
}

// start runs svc until ctx ends or stop, and returns once its API listens.
func start(ctx context.Context, svc *service.Service) (*running, error) {
	rctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		defer close(r.done)
		r.err = svc.Run(rctx, func(a net.Addr) { ready <- a.String() })
	}()
	select {
	case r.addr = <-ready:
		return r, nil
	case <-r.done:
		cancel()
		return nil, cmp.Or(r.err, ctx.Err(), errors.New("the service stopped at once"))
	}
}

// stop stops the service and waits until it has stopped.
func (r *running) stop() {
	r.cancel()
	<-r.done
}

// quiet is the logger of the benchmarks that print only their figures.
var quiet = slog.New(slog.DiscardHandler)

// startCPUProfile writes a CPU profile to path ("": none) until the
// returned stop, which may be called more than once.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { pprof.StopCPUProfile(); f.Close() }) }, nil
}

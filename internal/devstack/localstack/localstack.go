// Package localstack starts the local infrastructure of `engine dev`,
// `engine devstack`, the demo and the benchmarks: a Postgres cluster and an
// embedded Temporal dev server in one data directory, which the process
// that runs them holds locked. It is a package of its own because it links
// the Temporal server, which internal/devstack (used by every test
// package's harness) must not.
package localstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/devstack/devtemporal"
)

// Database is the database the local cluster serves the engine from.
const Database = "reveille"

// Options says what to start where.
type Options struct {
	// DataDir holds the Postgres cluster (DataDir/postgres) and Temporal's
	// SQLite file (DataDir/temporal). Required.
	DataDir string
	// Postgres and Temporal say which parts to start.
	Postgres, Temporal bool
	// TemporalPort is the embedded Temporal's frontend port (0: a free one).
	TemporalPort int
	// PostgresPort is the local Postgres's port (0: a free one; a reused
	// live postmaster keeps its own).
	PostgresPort int
	// Namespace is registered in the embedded Temporal (default "default").
	Namespace string
	// Holder names this process in the error a second one gets while it
	// holds the data dir ("engine dev").
	Holder string
	// Logger receives a line per part started (nil: none).
	Logger *slog.Logger
}

// Stack is the running local infrastructure.
type Stack struct {
	lock     *devstack.DataDirLock
	pg       *devstack.Postgres
	temporal *devtemporal.Server
}

// Start starts the parts o asks for. It holds the data dir's lock until
// Stop, so a second process fails at once instead of running a second
// Temporal on the SQLite file or stopping the first one's Postgres when it
// exits. On error, what started is stopped again.
func Start(ctx context.Context, o Options) (*Stack, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	st := &Stack{}
	if !o.Postgres && !o.Temporal {
		return st, nil
	}
	// Both ports are checked before anything is made: Temporal's own check
	// came after initdb had run and Postgres had started.
	if o.Postgres && (o.PostgresPort < 0 || o.PostgresPort > 65535) {
		return nil, fmt.Errorf("local Postgres: port %d: want 1 to 65535, or 0 for a free one", o.PostgresPort)
	}
	if o.Temporal && (o.TemporalPort < 0 || o.TemporalPort > 65535) {
		return nil, fmt.Errorf("embedded Temporal: port %d: want 1 to 65535, or 0 for a free one", o.TemporalPort)
	}
	lock, err := devstack.LockDataDir(o.DataDir, o.Holder)
	if errors.Is(err, devstack.ErrDataDirInUse) {
		return nil, fmt.Errorf("%w; stop it or use --data-dir", err)
	}
	if err != nil {
		return nil, err
	}
	st.lock = lock
	if o.Postgres {
		if err := st.startPostgres(ctx, o.DataDir, o.PostgresPort, logger); err != nil {
			st.Stop()
			return nil, err
		}
	}
	if o.Temporal {
		t, err := devtemporal.Start(ctx, devtemporal.Options{
			DataDir: filepath.Join(o.DataDir, "temporal"), Port: o.TemporalPort, Namespace: o.Namespace,
		})
		if err != nil {
			st.Stop()
			return nil, fmt.Errorf("embedded Temporal: %w", err)
		}
		st.temporal = t
		logger.Info("temporal ready", "address", t.Address(), "namespace", o.Namespace)
	}
	return st, nil
}

func (st *Stack) startPostgres(ctx context.Context, dataDir string, port int, logger *slog.Logger) error {
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dataDir, Port: port})
	if err != nil {
		return fmt.Errorf("local Postgres: %w", err)
	}
	st.pg = pg
	if err := pg.EnsureDatabase(ctx, Database); err != nil {
		return err
	}
	logger.Info("postgres ready", "url", pg.URL(Database), "reused", pg.Reused())
	return nil
}

// DatabaseURL is the local cluster's engine database ("" when Postgres was
// not started here).
func (st *Stack) DatabaseURL() string {
	if st.pg == nil {
		return ""
	}
	return st.pg.URL(Database)
}

// TemporalAddress is the embedded Temporal's frontend ("" when it was not
// started here).
func (st *Stack) TemporalAddress() string {
	if st.temporal == nil {
		return ""
	}
	return st.temporal.Address()
}

// PostgresExited is closed when the local Postgres exits (never when there
// is none).
func (st *Stack) PostgresExited() <-chan struct{} {
	if st.pg == nil {
		return make(chan struct{})
	}
	return st.pg.Wait()
}

// PostgresExit says how the local Postgres ended and where its log is,
// once PostgresExited's channel is closed.
func (st *Stack) PostgresExit() error { return st.pg.Exited() }

// Stop stops what Start started and releases the data dir.
func (st *Stack) Stop() {
	if st.temporal != nil {
		_ = st.temporal.Stop()
	}
	if st.pg != nil {
		_ = st.pg.Stop(context.Background())
	}
	if st.lock != nil {
		_ = st.lock.Release()
	}
}

// secretFile is where the data dir keeps the dev JWT secret.
const secretFile = "jwt-secret"

// DevSecret returns the dev JWT secret kept in dataDir, and its path,
// creating a random one on first use.
func DevSecret(dataDir string) (secret, path string, err error) {
	path = filepath.Join(dataDir, secretFile)
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) >= 32 {
		return strings.TrimSpace(string(b)), path, nil
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return "", path, fmt.Errorf("create data dir: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", path, err
	}
	secret = hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		return "", path, fmt.Errorf("write dev secret: %w", err)
	}
	return secret, path, nil
}

// ReadDevSecret returns the dev JWT secret an `engine dev` left in
// dataDir, without creating one.
func ReadDevSecret(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, secretFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

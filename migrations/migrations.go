// Package migrations holds Reveille's SQL schema as embedded goose
// migrations, applied by `engine migrate` and at the start of serve and dev.
//
// Files are numbered by the package that owns their tables; the DDL of a
// table lives here, its queries live in the owning package.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// lockID is the advisory lock key under which migrations run, so replicas
// starting together apply them one at a time. ("reveille" in ASCII.)
const lockID int64 = 0x7265766569_6c6c

func provider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migration locker: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration under the migration advisory lock. It
// returns the number applied.
func Up(ctx context.Context, db *sql.DB, logger *slog.Logger) (int, error) {
	p, err := provider(db, logger)
	if err != nil {
		return 0, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return len(res), fmt.Errorf("apply migrations: %w", err)
	}
	return len(res), nil
}

// UpPool applies pending migrations through a pgx pool.
func UpPool(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return Up(ctx, db, logger)
}

// Status writes one line per migration: its version, name and state.
func Status(ctx context.Context, db *sql.DB, w io.Writer) error {
	p, err := provider(db, nil)
	if err != nil {
		return err
	}
	statuses, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	for _, s := range statuses {
		applied := "pending"
		if s.State == goose.StateApplied {
			applied = "applied " + s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
		}
		fmt.Fprintf(w, "%05d  %-40s %s\n", s.Source.Version, s.Source.Path, applied)
	}
	return nil
}

// Files is the embedded migration source (for tools that hash or list it).
func Files() fs.FS { return files }

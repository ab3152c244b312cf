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
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// lockWait is how long a migrator waits for another's lock (tried every
// second) before it gives up: longer than any migration should take.
var lockWait = 5 * time.Minute

func provider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, uint64(lockWait/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("migration locker: %w", err)
	}
	return newProvider(db, goose.WithSessionLocker(locker))
}

// readProvider reads the applied versions without the migration lock: a
// status is not held by another process's migrations.
func readProvider(db *sql.DB) (*goose.Provider, error) { return newProvider(db) }

func newProvider(db *sql.DB, opts ...goose.ProviderOption) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, append(opts, goose.WithDisableGlobalRegistry(true))...)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration under the migration advisory lock. It
// returns the number applied. logger (nil: none) hears when it waits for
// another process's migrations.
func Up(ctx context.Context, db *sql.DB, logger *slog.Logger) (int, error) {
	p, err := provider(db)
	if err != nil {
		return 0, err
	}
	// (goose waits for the lock in silence: say so once when another
	// process holds it now, and name the lock when the wait gives up)
	holder, err := lockHolder(ctx, db)
	if err != nil {
		return 0, err
	}
	if holder != 0 && logger != nil {
		logger.Info("waiting for another process's migrations", "advisory_lock", lockID, "holder_pid", holder, "gives_up_after", lockWait.String())
	}
	var res []*goose.MigrationResult
	for deadline := time.Now().Add(lockWait); ; {
		var r []*goose.MigrationResult
		r, err = p.Up(ctx)
		res = append(res, r...)
		// (a failed Up returns what it applied before the failure in its
		// PartialError, not in r)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			res = append(res, partial.Applied...)
		}
		// (a migration that sets lock_timeout gave up waiting for a table
		// lock: try again in a moment rather than queue every writer)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || time.Now().After(deadline) {
			break
		}
		if logger != nil {
			logger.Info("a migration waited too long for a table lock; trying again", "error", pgErr.Message)
		}
		select {
		case <-ctx.Done():
			return len(res), ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil && strings.Contains(err.Error(), "failed to acquire lock") {
		return len(res), fmt.Errorf("apply migrations: another process held the migration lock (advisory lock %d) for %s — "+
			"a replica applying a long migration? pg_stat_activity shows what it runs: %w", lockID, lockWait, err)
	}
	if err != nil {
		return len(res), fmt.Errorf("apply migrations: %w", err)
	}
	return len(res), nil
}

// lockHolder is the backend pid that holds the migration lock, 0 when none.
func lockHolder(ctx context.Context, db *sql.DB) (int, error) {
	var pid int
	err := db.QueryRowContext(ctx, `SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(uint64(lockID)>>32), int64(uint64(lockID)&0xffffffff)).Scan(&pid)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("migration lock: %w", err)
	}
	return pid, nil
}

// UpPool applies pending migrations through a pgx pool.
func UpPool(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return Up(ctx, db, logger)
}

// Status writes one line per migration: its version, name and state.
func Status(ctx context.Context, db *sql.DB, w io.Writer) error {
	p, err := readProvider(db)
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
			applied = "applied " + s.AppliedAt.UTC().Format(timeFormat)
		}
		fmt.Fprintf(w, "%05d  %-40s %s\n", s.Source.Version, s.Source.Path, applied)
	}
	unknown, err := unknown(ctx, db, p)
	if err != nil {
		return err
	}
	for _, u := range unknown {
		fmt.Fprintf(w, "%05d  %-40s applied %s, unknown to this binary\n", u.Version, "?", u.AppliedAt.UTC().Format(timeFormat))
	}
	return nil
}

const timeFormat = "2006-01-02T15:04:05Z"

// AppliedVersion is a migration version applied to the database.
type AppliedVersion struct {
	Version   int64
	AppliedAt time.Time
}

// Unknown lists, in version order, the migrations applied to the database
// that this binary does not embed: a newer binary's, as when a deployment
// is rolled back to an older one. Up leaves them be and the older binary
// runs on the newer schema, which it was not tested against: serve says
// so at start, and `engine migrate status` lists them. A database never
// migrated has none.
func Unknown(ctx context.Context, db *sql.DB) ([]AppliedVersion, error) {
	p, err := provider(db)
	if err != nil {
		return nil, err
	}
	return unknown(ctx, db, p)
}

// UnknownPool is Unknown through a pgx pool.
func UnknownPool(ctx context.Context, pool *pgxpool.Pool) ([]AppliedVersion, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return Unknown(ctx, db)
}

func unknown(ctx context.Context, db *sql.DB, p *goose.Provider) ([]AppliedVersion, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migration versions: %w", err)
	}
	if !exists {
		return nil, nil
	}
	// goose records an apply as a row and a rollback by deleting it (older
	// versions: a later row with is_applied false): a version's latest row
	// says whether it is applied. Version 0 is goose's own first row.
	rows, err := db.QueryContext(ctx, `SELECT version_id, tstamp FROM (
		SELECT DISTINCT ON (version_id) version_id, is_applied, tstamp FROM goose_db_version ORDER BY version_id, id DESC) v
		WHERE is_applied AND version_id > 0 ORDER BY version_id`)
	if err != nil {
		return nil, fmt.Errorf("migration versions: %w", err)
	}
	defer rows.Close()
	known := make(map[int64]bool)
	for _, src := range p.ListSources() {
		known[src.Version] = true
	}
	var out []AppliedVersion
	for rows.Next() {
		var v AppliedVersion
		if err := rows.Scan(&v.Version, &v.AppliedAt); err != nil {
			return nil, fmt.Errorf("migration versions: %w", err)
		}
		if !known[v.Version] {
			out = append(out, v)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migration versions: %w", err)
	}
	return out, nil
}

// Files is the embedded migration source (for tools that hash or list it).
func Files() fs.FS { return files }

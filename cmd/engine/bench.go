package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/devstack"
)

// benchDatabase connects to DATABASE_URL, or starts a local Postgres with
// its durable defaults (fsync and synchronous commit on) in dataDir (a
// temporary directory, removed at the end, when empty). configure adjusts
// the pool (its size, a tracer) before it connects.
func benchDatabase(ctx context.Context, dataDir string, configure func(*pgxpool.Config)) (*pgxpool.Pool, func(), error) {
	dsn := os.Getenv("DATABASE_URL")
	cleanup := func() {}
	if dsn == "" {
		dir := dataDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "reveille-bench-*")
			if err != nil {
				return nil, nil, err
			}
			dir = tmp
		}
		pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: dir})
		if err != nil {
			return nil, nil, fmt.Errorf("local Postgres: %w", err)
		}
		if err := pg.EnsureDatabase(ctx, "reveille"); err != nil {
			_ = pg.Stop(context.Background())
			return nil, nil, err
		}
		dsn = pg.URL("reveille")
		fmt.Fprintf(os.Stderr, "bench: local Postgres at %s\n", dsn)
		cleanup = func() {
			_ = pg.Stop(context.Background())
			if dataDir == "" {
				_ = os.RemoveAll(pg.ClusterDir())
				_ = os.RemoveAll(dir)
			}
		}
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	configure(cfg)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return db, func() { db.Close(); cleanup() }, nil
}

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

package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/migrations"
)

// migrationDB opens the database DATABASE_URL names as serve reads it:
// through pgxpool's parser, which takes the pool's own settings
// (pool_max_conns, …: docs/operations.md) out of what is sent to the
// server — which refuses them as unknown parameters.
func migrationDB(databaseURL string) (*sql.DB, error) {
	cfg, err := migrationConnConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	return stdlib.OpenDB(*cfg), nil
}

// migrationConnConfig is the connection migrationDB opens, with the
// network bounds of serve's connections (db.BoundNetwork): a migration
// waiting on a dropped connection fails within about 35 s, and the server
// ends its session (and the migration lock it holds) as soon.
func migrationConnConfig(databaseURL string) (*pgx.ConnConfig, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	db.BoundNetwork(cfg.ConnConfig)
	return cfg.ConnConfig, nil
}

func runMigrate(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.Usage = func() {
		flagUsage(fs, "engine migrate up|status\n\n  up      apply the migrations this binary has that the database lacks\n"+
			"  status  list the migrations, applied or not, and applied ones this binary does not know",
			"  DATABASE_URL  the database migrated (required)\n")
	}
	// (after its argument too, as `engine bench <name> --help`: the flag
	// parser stops at the first argument and would call it unexpected)
	if asksForHelp(args) {
		fs.Usage()
		return flag.ErrHelp
	}
	if err := parseArgs(fs, args, 1); err != nil {
		return err
	}
	// The argument first: a wrong one is the mistake to name, whatever the
	// environment lacks or holds.
	switch sub := fs.Arg(0); sub {
	case "up", "status":
	case "":
		fs.Usage()
		return errors.New("want up or status")
	default:
		fs.Usage()
		return fmt.Errorf("want up or status, not %q", sub)
	}
	if envErr != nil {
		return envErr
	}
	if s.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set")
	}
	sqlDB, err := migrationDB(s.DatabaseURL)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	switch fs.Arg(0) {
	case "up":
		n, err := migrations.Up(ctx, sqlDB, newLogger(s.LogLevel))
		if err != nil {
			return err
		}
		fmt.Printf("applied %d migration(s)\n", n)
		return nil
	default: // "status"
		return migrations.Status(ctx, sqlDB, os.Stdout)
	}
}

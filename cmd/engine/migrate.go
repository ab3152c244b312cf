package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/reveille/reveille/migrations"
)

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
	if _, err := pgx.ParseConfig(s.DatabaseURL); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	db, err := sql.Open("pgx", s.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	switch fs.Arg(0) {
	case "up":
		n, err := migrations.Up(ctx, db, newLogger(s.LogLevel))
		if err != nil {
			return err
		}
		fmt.Printf("applied %d migration(s)\n", n)
		return nil
	default: // "status"
		return migrations.Status(ctx, db, os.Stdout)
	}
}

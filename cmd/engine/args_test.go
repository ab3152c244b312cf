package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The flag package stops at the first argument that is not a flag, so a
// stray argument silently dropped itself and every flag after it (bench
// rest --route spend extra --duration 1s ran the default 10 s). Every
// command refuses it at start, naming it, before it touches anything: the
// context here is already canceled and the database is never dialled.
func TestEveryCommandRefusesAnUnexpectedArgumentNamingIt(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("TEMPORAL_ADDRESS", "never-dialled.invalid:7233")
	t.Setenv("REVEILLE_DATA_DIR", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	type run struct {
		command string
		args    []string
	}
	runs := []run{
		{"load", []string{"--wakeups", "5", "extra"}},
		{"bench", []string{"rest", "--route", "spend", "extra", "--duration", "1s"}},
		{"migrate", []string{"status", "extra"}},
		{"migrate", []string{"up", "extra"}},
	}
	for _, b := range benchNames() {
		runs = append(runs, run{"bench", []string{b, "extra"}})
	}
	for _, c := range commands() {
		if c.name != "bench" && c.name != "migrate" {
			runs = append(runs, run{c.name, []string{"extra"}})
		}
	}
	for _, r := range runs {
		t.Run(r.command+" "+strings.Join(r.args, " "), func(t *testing.T) {
			i := slices.IndexFunc(commands(), func(c command) bool { return c.name == r.command })
			err := commands()[i].run(ctx, r.args)
			require.EqualError(t, err, `unexpected argument "extra"`)
		})
	}
}

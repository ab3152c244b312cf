package main

import (
	"cmp"
	"context"
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/demo"
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

// captureOSStderr runs f with os.Stderr (where the flag package and the
// usages print) going to a pipe, and returns f's error and what it printed.
func captureOSStderr(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = w
	runErr := f()
	os.Stderr = saved
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return string(out), runErr
}

// --help is a request, not a mistake: every command prints its usage and
// ends with flag.ErrHelp, which main exits 0 on. version took it for an
// unexpected argument and bench for a wrong benchmark name, both exit 1;
// migrate, which has no flags, printed an empty Flags: section.
func TestEveryCommandPrintsItsUsageOnHelp(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_DATA_DIR", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range commands() {
		for _, help := range []string{"--help", "-h"} {
			t.Run(c.name+" "+help, func(t *testing.T) {
				out, err := captureOSStderr(t, func() error { return c.run(ctx, []string{help}) })

				require.ErrorIs(t, err, flag.ErrHelp)
				require.True(t, strings.HasPrefix(out, "Usage: engine "+c.name), out)
				require.NotRegexp(t, `Flags:\n*$`, out, "no empty Flags: section")
			})
		}
	}
	// (after the subcommand too, as engine bench <name> --help: it was an
	// unexpected argument, exit 1)
	for _, args := range [][]string{{"up", "--help"}, {"status", "-h"}} {
		t.Run("migrate "+strings.Join(args, " "), func(t *testing.T) {
			out, err := captureOSStderr(t, func() error { return runMigrate(ctx, args) })
			require.ErrorIs(t, err, flag.ErrHelp)
			require.True(t, strings.HasPrefix(out, "Usage: engine migrate"), out)
		})
	}
	t.Run("bench lists its benchmarks", func(t *testing.T) {
		out, err := captureOSStderr(t, func() error { return runBench(ctx, []string{"--help"}) })
		require.ErrorIs(t, err, flag.ErrHelp)
		for _, b := range benchNames() {
			require.Contains(t, out, "\n  "+b+"\n")
		}
	})
}

// migrate names a missing or wrong argument before it looks for
// DATABASE_URL: the argument is the mistake, whatever the environment.
func TestMigrateChecksItsArgumentBeforeTheDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "want up or status"},
		{[]string{"down"}, `want up or status, not "down"`},
		{[]string{"up"}, "DATABASE_URL is not set"},
		{[]string{"status"}, "DATABASE_URL is not set"},
	} {
		t.Run(cmp.Or(strings.Join(tc.args, " "), "no argument"), func(t *testing.T) {
			_, err := captureOSStderr(t, func() error { return runMigrate(context.Background(), tc.args) })
			require.EqualError(t, err, tc.want)
		})
	}
}

// engine demo's description lists what it runs: it said "a success, a
// failure, a cancel and an approved overrun" while it ran six cases, two
// of them tool calls a human answers.
func TestTheDemoDescriptionListsEveryCase(t *testing.T) {
	phrases := map[string]string{ // the demo's case → how the description says it
		"success":                       "a success",
		"failure":                       "a failure",
		"cancel":                        "a cancel",
		"tool call approved by a human": "a tool call approved",
		"tool call denied by a human":   "one denied",
		"refused, then approved":        "a refused-then-approved spend",
	}
	i := slices.IndexFunc(commands(), func(c command) bool { return c.name == "demo" })
	summary := commands()[i].summary
	require.Len(t, demo.CaseNames(), len(phrases), "a case the description does not list")
	for _, name := range demo.CaseNames() {
		phrase, ok := phrases[name]
		require.True(t, ok, "the description does not list the case %q", name)
		require.Contains(t, summary, phrase)
	}
	require.Contains(t, summary, "six ways")
}

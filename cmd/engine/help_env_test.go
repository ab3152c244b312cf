package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/demo"
)

// README: "`engine <command> --help` (or -h) prints the command's usage and
// exits 0, for every command" and "Flags override environment variables".
// An operator whose start failed on a malformed variable and who asks
// `engine serve --help` what it wants gets the same error again, exit 1.
func TestHelpIsPrintedWhateverTheEnvironmentHolds(t *testing.T) {
	for _, c := range commands() {
		if c.name == "version" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_ORG_RATE", "lots")
			args := []string{"--help"}
			if c.name == "bench" {
				args = []string{"pool", "--help"}
			}
			out, err := captureOSStderr(t, func() error { return c.run(context.Background(), args) })
			require.ErrorIs(t, err, flag.ErrHelp)
			require.True(t, strings.HasPrefix(out, "Usage: engine "+c.name), out)
		})
	}
}

// README: "A malformed or out-of-range value stops the command at start,
// before it connects to anything, with an error naming the variable (or
// flag)". REVEILLE_API_URL (`--api`) is read unchecked: a URL without its
// scheme, the usual slip, is taken by the demo for an engine that does not
// answer, and it starts a whole engine dev stack of its own in the data
// directory (or, beside a running `engine dev`, fails on its data
// directory's lock) — never naming the variable.
func TestEnvConfigRefusesAMalformedAPIURL(t *testing.T) {
	for _, v := range []string{"localhost:8080", "127.0.0.1:8080", "http//localhost:8080"} {
		t.Run(v, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_API_URL", v)
			require.ErrorContains(t, runDemo(context.Background(), nil), "REVEILLE_API_URL")
			require.ErrorContains(t, runLoad(context.Background(), nil), "REVEILLE_API_URL")
		})
	}
}

func TestTheDemoDoesNotStartAnEngineForAMalformedAPIURL(t *testing.T) {
	started := false
	err := demo.Run(context.Background(), demo.Config{APIURL: "localhost:8080", Org: devOrg, DataDir: t.TempDir(),
		StartEngine: func(context.Context) (demo.Engine, error) {
			started = true
			return demo.Engine{}, errors.New("data directory ./.reveille is in use by pid 1234 (engine dev); stop it or use --data-dir")
		}})
	require.False(t, started, "the demo started an engine of its own for a malformed --api; it ended with: %v", err)
	require.ErrorContains(t, err, "localhost:8080")
}

package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// REVEILLE_API_URL is read by engine demo and engine load only (config.go:
// "the engine the demo talks to"; serve --help does not list it). Since
// bfd335c envConfig refuses a malformed one for every command: a
// deployment whose environment holds REVEILLE_API_URL=engine:8080 (for a
// script, a sidecar) no longer starts serve after the upgrade, for a
// variable serve never reads. Here serve must get as far as its own
// first check (DATABASE_URL), and token must print a token.
func TestAMalformedAPIURLStopsOnlyTheCommandsThatReadIt(t *testing.T) {
	clearEnv(t)
	t.Setenv("REVEILLE_API_URL", "engine:8080")
	err := runServe(context.Background(), nil)
	require.ErrorContains(t, err, "DATABASE_URL is not set", "serve stopped on a variable it does not read: %v", err)

	t.Setenv("REVEILLE_JWT_SECRET", "a-secret-of-at-least-32-bytes-long!!")
	_, err = captureOSStderr(t, func() error { return runToken(context.Background(), []string{"--org", "o"}) })
	require.NoError(t, err, "token stopped on a variable it does not read")
}

// README § Configuration: "Flags override environment variables". engine
// load --api http://127.0.0.1:1 (a good URL) with a malformed
// REVEILLE_API_URL in the environment stops on the variable the flag
// overrides.
func TestTheAPIFlagOverridesAMalformedAPIURL(t *testing.T) {
	clearEnv(t)
	t.Setenv("REVEILLE_API_URL", "localhost:8080")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // (the load need not run: it must only get past the environment)
	err := runLoad(ctx, []string{"--api", "http://127.0.0.1:1"})
	require.NotContains(t, errString(err), "REVEILLE_API_URL", "the flag overrides the variable")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

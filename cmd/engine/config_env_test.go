package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// REVEILLE_POOLS of separators alone names no pool: on a fresh database
// every wake-up is then 400 "unknown pool", and approval webhooks go to a
// pool ("default") that is not one of REVEILLE_POOLS — which
// REVEILLE_WEBHOOK_POOL's own check exists to prevent. A value that sets
// nothing is malformed: the start stops, naming the variable.
func TestEnvConfigRefusesPoolsThatNameNoPool(t *testing.T) {
	for _, v := range []string{",", " ", " , "} {
		t.Run(v, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_POOLS", v)
			t.Setenv("REVEILLE_WEBHOOK_POOL", "")
			s, err := envConfig()
			require.ErrorContains(t, err, "REVEILLE_POOLS", "pools %v, webhook pool %q", s.Pools, s.WebhookPool)
		})
	}
}

// TEMPORAL_ADDRESS is a host:port (README: "Temporal frontend";
// serve --help: "Temporal frontend host:port"). A URL or a host without a
// port is malformed — the client cannot dial "http://…" at all ("too many
// colons"), and dials a bare host on port 443 — yet serve started,
// logging only that Temporal "does not answer at start: signals wait in
// the outbox until it does", which they do forever. The README: a
// malformed value stops the command at start, naming the variable.
func TestEnvConfigRefusesAMalformedTemporalAddress(t *testing.T) {
	for _, v := range []string{"http://127.0.0.1:7233", "temporal.example.com", "127.0.0.1:port"} {
		t.Run(v, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("TEMPORAL_ADDRESS", v)
			_, err := envConfig()
			require.ErrorContains(t, err, "TEMPORAL_ADDRESS")
		})
	}
	for _, good := range []string{"127.0.0.1:7233", "temporal.example.com:7233", "[::1]:7233"} {
		clearEnv(t)
		t.Setenv("TEMPORAL_ADDRESS", good)
		_, err := envConfig()
		require.NoError(t, err)
	}
}

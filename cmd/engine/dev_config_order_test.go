package main

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// README § Configuration: "A malformed or out-of-range value stops the
// command at start, before it connects to anything, with an error naming
// the variable". engine dev checks the token settings (a secret too short,
// a JWKS URL without issuer and audience) and DATABASE_URL only after it
// has run initdb and started its local Postgres (or its embedded
// Temporal): the operator waits for a whole stack to come up, and be torn
// down, before being told the variable is wrong — and finds a cluster in a
// data dir they never meant to fill.
func TestDevRefusesBadSettingsBeforeStartingItsStack(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"a secret too short", map[string]string{"REVEILLE_JWT_SECRET": "short"}, "REVEILLE_JWT_SECRET"},
		{"a JWKS URL without issuer and audience", map[string]string{"REVEILLE_JWKS_URL": "https://idp.example.com/jwks.json"}, "REVEILLE_JWT_ISSUER"},
		// (DATABASE_URL set: no local Postgres; TEMPORAL_ADDRESS unset: the embedded Temporal)
		{"a malformed DATABASE_URL", map[string]string{"DATABASE_URL": "postgres://u:pw@db.invalid:5432/reveille?sslmode=bogus",
			"TEMPORAL_ADDRESS": "", "REVEILLE_JWT_SECRET": firstSecret}, "DATABASE_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			t.Setenv("REVEILLE_DATA_DIR", dir)
			t.Setenv("REVEILLE_ADDR", "127.0.0.1:0")
			t.Setenv("TEMPORAL_ADDRESS", closedAddr(t)) // only the local Postgres would start
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			i := slices.IndexFunc(commands(), func(c command) bool { return c.name == "dev" })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			start := time.Now()
			err := commands()[i].run(ctx, nil)

			require.ErrorContains(t, err, tc.want)
			entries, rerr := os.ReadDir(dir)
			require.NoError(t, rerr)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			require.Empty(t, names, "refused after %s, having created %v in the data dir (its local stack was started first)",
				time.Since(start).Round(time.Millisecond), names)
		})
	}
}

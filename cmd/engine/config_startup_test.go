package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/db"
)

// README § Configuration: "A malformed or out-of-range value stops the
// command at start, before it connects to anything, with an error naming
// the variable". DATABASE_URL="" is refused ("DATABASE_URL is not set"), but
// a blank one (whitespace: a templated value that came out empty, a stray
// space in a .env file) is handed to pgx, which reads it as an empty
// key=value string: the local Unix socket, the OS user, its database. serve
// then waits on that Postgres (or connects to a local one that is there),
// and exits 0 when stopped.
func TestServeRefusesABlankDatabaseURL(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", "   ")
	t.Setenv("TEMPORAL_ADDRESS", closedAddr(t))
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
	t.Setenv("REVEILLE_ADDR", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()

	err := runServe(ctx, nil)

	require.Error(t, err, "serve took DATABASE_URL=\"   \" and went on to connect (to the default local socket)")
	require.ErrorContains(t, err, "DATABASE_URL")
}

// The same for engine migrate: a blank DATABASE_URL is "not set", not the
// default local database.
func TestMigrateRefusesABlankDatabaseURL(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", " ")
	_, err := captureOSStderr(t, func() error { return runMigrate(context.Background(), []string{"status"}) })
	require.EqualError(t, err, "DATABASE_URL is not set")
}

// README § Configuration: the error names the variable. serve says
// "DATABASE_URL: cannot parse …"; migrate, for the same value, says
// "migration lock: cannot parse …" and never names DATABASE_URL.
func TestMigrateNamesAMalformedDatabaseURL(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/x?sslmode=bogus")
	_, err := captureOSStderr(t, func() error { return runMigrate(context.Background(), []string{"up"}) })
	require.ErrorContains(t, err, "DATABASE_URL")
}

// engine load's --temporal and --target are checked only when they are
// used: after the load has called the API (twice: the agent platform's and
// the approver's whoami). TEMPORAL_ADDRESS with the same value is refused
// at start naming the variable (config.go temporalAddr), but the flag that
// overrides it is not checked at all. README § Configuration: a malformed
// value "stops the command at start, before it connects to anything, with
// an error naming the variable (or flag)".
func TestLoadChecksItsAddressFlagsBeforeCallingTheAPI(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"temporal without a port", []string{"--temporal", "temporal.example.com"}, "--temporal"},
		{"target with a bad port", []string{"--target", "127.0.0.1:99999"}, "--target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				// whoami answers with the token's own claims
				parts := strings.Split(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), ".")
				claims, _ := base64.RawURLEncoding.DecodeString(parts[len(parts)/2])
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(claims)
			}))
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			err := runLoad(ctx, append([]string{"--api", srv.URL}, tc.args...))

			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.flag, "the error names the flag: %v", err)
			assert.Zero(t, hits.Load(), "the API was called %d times before the malformed %s was refused (%v)", hits.Load(), tc.flag, err)
		})
	}
}

// README: REVEILLE_JWT_ISSUER, REVEILLE_JWT_AUDIENCE "both must be set
// with REVEILLE_JWKS_URL (serve refuses to start without them)". A blank
// value counts as set: serve starts, and every token is refused at request
// time (no IdP issues iss " "). The secrets and the JWKS URL are trimmed
// (config.go list, jwksURL); these two are taken verbatim, so a trailing
// newline from a mounted secret file does the same silently.
func TestABlankJWTIssuerOrAudienceIsNotSet(t *testing.T) {
	for _, tc := range []struct{ issuer, audience, missing string }{
		{"  ", "reveille", "REVEILLE_JWT_ISSUER"},
		{"https://idp.example.com/", " ", "REVEILLE_JWT_AUDIENCE"},
	} {
		t.Run(tc.missing, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_JWKS_URL", "https://idp.example.com/.well-known/jwks.json")
			t.Setenv("REVEILLE_JWT_ISSUER", tc.issuer)
			t.Setenv("REVEILLE_JWT_AUDIENCE", tc.audience)
			s, err := envConfig()
			if err == nil {
				err = s.authConfig().Validate()
			}
			require.Error(t, err, "issuer %q, audience %q: accepted as set", tc.issuer, tc.audience)
			require.ErrorContains(t, err, tc.missing)
		})
	}
}

// README § Configuration: "Flags override environment variables". The
// project holds this for --api over a malformed REVEILLE_API_URL
// (TestTheAPIFlagOverridesAMalformedAPIURL), but not for the other flags
// that stand for a variable: envConfig has already recorded the variable's
// error, and the command returns it after its flags parsed — serve --addr
// over a malformed REVEILLE_ADDR, serve --worker over a malformed
// REVEILLE_WORKER, load --temporal over a malformed TEMPORAL_ADDRESS are
// all refused for the variable the flag overrides.
func TestFlagsOverrideAMalformedVariable(t *testing.T) {
	for _, tc := range []struct {
		name, env, value string
		run              func(ctx context.Context) error
	}{
		{"serve --addr", "REVEILLE_ADDR", "8080", func(ctx context.Context) error {
			return runServe(ctx, []string{"--addr", "127.0.0.1:0"})
		}},
		{"serve --worker", "REVEILLE_WORKER", "yes", func(ctx context.Context) error {
			return runServe(ctx, []string{"--worker=false"})
		}},
		{"load --temporal", "TEMPORAL_ADDRESS", "temporal", func(ctx context.Context) error {
			return runLoad(ctx, []string{"--api", "http://127.0.0.1:1", "--temporal", "127.0.0.1:7233"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
			t.Setenv(tc.env, tc.value)
			// (the command need not run: it must only get past the
			// environment; serve then stops at DATABASE_URL)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := tc.run(ctx)
			assert.NotContains(t, errString(err), tc.env, "the flag overrides %s, yet the command stopped on it", tc.env)
		})
	}
}

// A blank DATABASE_URL is unset; any other is kept as given: in a
// key=value string an escaped trailing space is the password's.
func TestADatabaseURLIsKeptAsGivenUnlessBlank(t *testing.T) {
	clearEnv(t)
	raw := `host=127.0.0.1 port=5432 user=reveille dbname=reveille password=abc\ `
	t.Setenv("DATABASE_URL", raw)
	s, err := envConfig()
	require.NoError(t, err)
	used, err := pgx.ParseConfig(s.DatabaseURL)
	require.NoError(t, err)
	require.Equal(t, "abc ", used.Password, "DATABASE_URL %q became %q", raw, s.DatabaseURL)
}

// engine migrate takes the DATABASE_URL serve takes: the pool's settings
// in it (pool_max_conns, docs/operations.md) are the pool's, not sent to
// the server, which refuses an unknown parameter. (The parse is what
// decides; cmd/engine's tests run no Postgres.)
func TestMigrateTakesTheDatabaseURLServeTakes(t *testing.T) {
	cfg, err := migrationConnConfig("postgres://u@127.0.0.1:1/x?pool_max_conns=30&application_name=reveille")
	require.NoError(t, err)
	require.NotContains(t, cfg.RuntimeParams, "pool_max_conns")
	require.Equal(t, "reveille", cfg.RuntimeParams["application_name"], "the server's own parameters are still sent")
}

// engine migrate's connection has serve's network bounds: a migration
// waiting on a connection the network dropped gives up within about 35 s
// (the dialer's keepalive and TCP_USER_TIMEOUT), and the server ends its
// session, and the migration lock it holds, as soon. A parameter the URL
// sets wins.
func TestMigrateDialsWithServesNetworkBounds(t *testing.T) {
	cfg, err := migrationConnConfig("postgres://u@127.0.0.1:1/x?tcp_keepalives_idle=60")
	require.NoError(t, err)
	require.NotNil(t, cfg.DialFunc)
	require.Equal(t, reflect.ValueOf(db.Dial).Pointer(), reflect.ValueOf(cfg.DialFunc).Pointer(), "dialled with db.Dial")
	for k, v := range db.ServerSessionParams() {
		if k == "tcp_keepalives_idle" {
			v = "60"
		}
		require.Equal(t, v, cfg.RuntimeParams[k], k)
	}
}

// A URL's surrounding whitespace (a secret file's newline, CRLF, a stray
// space) is not part of it: it still parses, for serve and for migrate.
func TestADatabaseURLWithSurroundingWhitespaceStillParses(t *testing.T) {
	for _, raw := range []string{
		"postgres://reveille:secret@127.0.0.1:5432/reveille?sslmode=disable\n",
		"postgres://reveille:secret@127.0.0.1:5432/reveille?sslmode=disable\r\n",
		" postgresql://reveille:secret@127.0.0.1:5432/reveille?sslmode=disable",
	} {
		clearEnv(t)
		t.Setenv("DATABASE_URL", raw)
		s, err := envConfig()
		require.NoError(t, err)
		cfg, err := pgx.ParseConfig(s.DatabaseURL) // what serve's pool parse does first
		require.NoError(t, err, "DATABASE_URL %q", raw)
		require.Equal(t, "reveille", cfg.Database, "DATABASE_URL %q", raw)
		_, err = migrationConnConfig(s.DatabaseURL)
		require.NoError(t, err, "engine migrate, DATABASE_URL %q", raw)
	}
}

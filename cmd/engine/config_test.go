package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool/httpwork"
)

func TestEnvConfigReadsTheRequestLimits(t *testing.T) {
	vars := []string{"REVEILLE_READ_HEADER_TIMEOUT", "REVEILLE_READ_TIMEOUT", "REVEILLE_IDLE_TIMEOUT", "REVEILLE_ORG_RATE", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST"}
	for _, v := range vars {
		t.Setenv(v, "")
	}
	s, err := envConfig()
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, s.HeaderTimeout)
	require.Equal(t, 60*time.Second, s.ReadTimeout)
	require.Equal(t, 120*time.Second, s.IdleTimeout)
	require.Equal(t, 10_000.0, s.OrgRate)
	require.Equal(t, 1000, s.StreamChunks)

	for v, val := range map[string]string{"REVEILLE_READ_HEADER_TIMEOUT": "2s", "REVEILLE_READ_TIMEOUT": "30s", "REVEILLE_IDLE_TIMEOUT": "1m",
		"REVEILLE_ORG_RATE": "0", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "50"} {
		t.Setenv(v, val)
	}
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, s.HeaderTimeout)
	require.Equal(t, 30*time.Second, s.ReadTimeout)
	require.Equal(t, time.Minute, s.IdleTimeout)
	require.Zero(t, s.OrgRate, "0 turns the rate limit off")
	require.Equal(t, 50, s.StreamChunks)

	t.Setenv("REVEILLE_ORG_RATE", "2.5")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2.5, s.OrgRate)

	for v, bad := range map[string]string{"REVEILLE_READ_TIMEOUT": "soon", "REVEILLE_ORG_RATE": "-1", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "0"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv(v, bad)
			_, err := envConfig()
			require.ErrorContains(t, err, v)
		})
	}
	t.Setenv("REVEILLE_ORG_RATE", "NaN")
	_, err = envConfig()
	require.ErrorContains(t, err, "REVEILLE_ORG_RATE")
}

// A malformed http allow-list or net stops the service at start, naming the
// variable and the entry, instead of being silently ignored.
func TestEnvConfigRejectsInvalidHTTPNetworkRules(t *testing.T) {
	for _, tc := range []struct {
		name, hosts, nets, contains string
	}{
		{"a URL as a host", "https://api.example.com", "", `REVEILLE_HTTP_ALLOWED_HOSTS entry "https://api.example.com"`},
		{"a bad port", "api.example.com:http", "", `port "http"`},
		{"IPv6 without brackets", "::1", "", "brackets"},
		{"a net that is not a CIDR", "", "10.0.0.0/40", `REVEILLE_HTTP_ALLOWED_NETS entry "10.0.0.0/40"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REVEILLE_HTTP_ALLOWED_HOSTS", tc.hosts)
			t.Setenv("REVEILLE_HTTP_ALLOWED_NETS", tc.nets)
			_, err := envConfig()
			require.ErrorContains(t, err, tc.contains)
		})
	}
	t.Run("the new entry syntax is accepted", func(t *testing.T) {
		t.Setenv("REVEILLE_HTTP_ALLOWED_HOSTS", "api.example.com, api.example.com:8443,localhost:*,[::1]:*,127.0.0.1:*")
		t.Setenv("REVEILLE_HTTP_ALLOWED_NETS", "10.0.0.0/8,fd00::/8")
		s, err := envConfig()
		require.NoError(t, err)
		require.Len(t, s.HTTPAllowed, 5)
		require.Equal(t, []string{"10.0.0.0/8", "fd00::/8"}, s.HTTPNets)
	})
	t.Run("the dev default is valid", func(t *testing.T) {
		_, err := httpwork.ParseAllowList(devHTTPAllowed)
		require.NoError(t, err)
	})
}

const (
	firstSecret  = "first-secret-first-secret-first-secret-01"
	secondSecret = "second-secret-second-secret-second-secret"
)

// serve checks its token settings before it touches Postgres or Temporal,
// so these runs end at the check (the database URL is never dialled).
func TestServeRefusesToStartWithAJWKSButNoIssuerOrAudience(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_JWT_SECRET", "")
	t.Setenv("REVEILLE_JWKS_URL", "https://idp.invalid/jwks")
	cases := []struct{ issuer, audience, missing string }{
		{"", "", "REVEILLE_JWT_ISSUER and REVEILLE_JWT_AUDIENCE"},
		{"https://idp", "", "REVEILLE_JWT_AUDIENCE"},
		{"", "reveille", "REVEILLE_JWT_ISSUER"},
	}
	for _, tc := range cases {
		t.Setenv("REVEILLE_JWT_ISSUER", tc.issuer)
		t.Setenv("REVEILLE_JWT_AUDIENCE", tc.audience)

		err := runServe(context.Background(), nil)

		require.ErrorContains(t, err, "REVEILLE_JWKS_URL needs "+tc.missing)
	}
}

func TestServeRefusesToStartWithAShortSecretAmongSeveral(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_JWKS_URL", "")
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret+",too-short")

	err := runServe(context.Background(), nil)

	require.ErrorContains(t, err, "secret 2 of 2")
}

func TestTheSecretListIsCommaSeparatedAndItsFirstSigns(t *testing.T) {
	t.Setenv("REVEILLE_JWT_SECRET", " "+firstSecret+" , "+secondSecret+" ")
	s, err := envConfig()
	require.NoError(t, err)

	cfg := s.authConfig()

	require.Equal(t, [][]byte{[]byte(firstSecret), []byte(secondSecret)}, cfg.Secrets)
	require.NoError(t, cfg.Validate())
	require.Equal(t, firstSecret, s.signingSecret())
}

// Empty entries (",,", a trailing comma) are no secret at all — not a
// zero-length key — and a list of nothing but them leaves serve without
// token verification, which it refuses; a duplicate is harmless.
func TestTheSecretListSkipsEmptyEntriesAndServeRefusesOneWithNone(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_JWKS_URL", "")
	cases := []struct {
		env  string
		want []string
	}{
		{firstSecret + ",," + secondSecret + ",", []string{firstSecret, secondSecret}},
		{",\t" + firstSecret + "\n,", []string{firstSecret}},
		{firstSecret + "," + firstSecret, []string{firstSecret, firstSecret}},
		{",,", nil},
		{" , ", nil},
	}
	for _, tc := range cases {
		t.Setenv("REVEILLE_JWT_SECRET", tc.env)
		s, err := envConfig()
		require.NoError(t, err)
		cfg := s.authConfig()

		require.Len(t, cfg.Secrets, len(tc.want), "%q", tc.env)
		for i, w := range tc.want {
			require.Equal(t, w, string(cfg.Secrets[i]), "%q", tc.env)
		}
		if tc.want == nil {
			require.ErrorContains(t, runServe(context.Background(), nil), "no token verification configured", "%q", tc.env)
		} else {
			require.NoError(t, cfg.Validate(), "%q", tc.env)
			require.Equal(t, tc.want[0], s.signingSecret())
		}
	}
}

func TestEngineTokenSignsWithTheFirstSecret(t *testing.T) {
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret+","+secondSecret)
	t.Setenv("REVEILLE_JWT_ISSUER", "")
	t.Setenv("REVEILLE_JWT_AUDIENCE", "")

	out := captureStdout(t, func() error { return runToken(context.Background(), []string{"--org", "o"}) })

	tok := strings.TrimSpace(out)
	verifies := func(secret string) bool {
		_, err := jwt.Parse(tok, func(*jwt.Token) (any, error) { return []byte(secret), nil }, jwt.WithValidMethods([]string{"HS256"}))
		return err == nil
	}
	require.True(t, verifies(firstSecret))
	require.False(t, verifies(secondSecret))
}

// captureStdout runs f and returns what it printed.
func captureStdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stdout
	os.Stdout = w
	runErr := f()
	os.Stdout = saved
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, runErr)
	return string(out)
}

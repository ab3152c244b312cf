package main

import (
	"cmp"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/retention"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

func TestEnvConfigReadsTheRequestLimits(t *testing.T) {
	vars := []string{"REVEILLE_READ_HEADER_TIMEOUT", "REVEILLE_READ_TIMEOUT", "REVEILLE_WRITE_TIMEOUT", "REVEILLE_IDLE_TIMEOUT", "REVEILLE_ORG_RATE", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST"}
	for _, v := range vars {
		t.Setenv(v, "")
	}
	s, err := envConfig()
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, s.HeaderTimeout)
	require.Equal(t, 60*time.Second, s.ReadTimeout)
	require.Equal(t, 60*time.Second, s.WriteTimeout)
	require.Equal(t, 120*time.Second, s.IdleTimeout)
	require.Equal(t, 10_000.0, s.OrgRate)
	require.Equal(t, 1000, s.StreamChunks)

	for v, val := range map[string]string{"REVEILLE_READ_HEADER_TIMEOUT": "2s", "REVEILLE_READ_TIMEOUT": "30s", "REVEILLE_WRITE_TIMEOUT": "45s", "REVEILLE_IDLE_TIMEOUT": "1m",
		"REVEILLE_ORG_RATE": "0", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "50"} {
		t.Setenv(v, val)
	}
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, s.HeaderTimeout)
	require.Equal(t, 30*time.Second, s.ReadTimeout)
	require.Equal(t, 45*time.Second, s.WriteTimeout)
	require.Equal(t, time.Minute, s.IdleTimeout)
	require.Zero(t, s.OrgRate, "0 turns the rate limit off")
	require.Equal(t, 50, s.StreamChunks)

	t.Setenv("REVEILLE_ORG_RATE", "2.5")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2.5, s.OrgRate)

	for v, bad := range map[string]string{"REVEILLE_READ_TIMEOUT": "soon", "REVEILLE_WRITE_TIMEOUT": "0s", "REVEILLE_ORG_RATE": "-1", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "0"} {
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

// clearEnv unsets every variable envConfig reads, so that a test sees only
// what it sets.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, name := range envNames(t) {
		t.Setenv(name, "")
	}
}

// envNames lists the variables config.go names.
func envNames(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("config.go")
	require.NoError(t, err)
	var names []string
	for _, m := range regexp.MustCompile(`"((?:REVEILLE|TEMPORAL)_[A-Z_]+|DATABASE_URL)"`).FindAllStringSubmatch(string(src), -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	require.NotEmpty(t, names)
	return names
}

func TestEnvConfigHandsTheWorkpoolItsTypedConfig(t *testing.T) {
	clearEnv(t)
	s, err := envConfig()
	require.NoError(t, err)
	require.Equal(t, workpool.Config{Pools: map[string]int{"default": 25, "wakeup": 25}, RecoveryPeriod: 10 * time.Second,
		HeartbeatTimeout: 30 * time.Second, WorkRetention: 24 * time.Hour, MaxPendingPerOrg: workpool.DefaultMaxPendingPerOrg,
		HookTimeout: workpool.DefaultHookTimeout}, s.workpoolConfig(), "the documented defaults")

	t.Setenv("REVEILLE_POOLS", "a=2,wakeup=1")
	t.Setenv("REVEILLE_RECOVERY_PERIOD", "3s")
	t.Setenv("REVEILLE_HEARTBEAT_TIMEOUT", "9s")
	t.Setenv("REVEILLE_WORK_RETENTION", "1h")
	t.Setenv("REVEILLE_ORG_MAX_PENDING", "5")
	t.Setenv("REVEILLE_HOOK_TIMEOUT", "2s")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, workpool.Config{Pools: map[string]int{"a": 2, "wakeup": 1}, RecoveryPeriod: 3 * time.Second,
		HeartbeatTimeout: 9 * time.Second, WorkRetention: time.Hour, MaxPendingPerOrg: 5, HookTimeout: 2 * time.Second}, s.workpoolConfig())

	t.Setenv("REVEILLE_HEARTBEAT_TIMEOUT", "3s")
	s, err = envConfig()
	require.NoError(t, err, "the least heartbeat timeout is accepted (the fault suite's)")
	require.Equal(t, 3*time.Second, s.workpoolConfig().HeartbeatTimeout)
}

func TestEnvConfigCapsHTTPRequestsOnlyWhenAsked(t *testing.T) {
	clearEnv(t)
	s, err := envConfig()
	require.NoError(t, err)
	require.Zero(t, s.serviceConfig(nil).HTTPWork.Timeout, "unset: a request runs as long as its work's timeout_ms")
	t.Setenv("REVEILLE_HTTP_TIMEOUT", "45s")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, s.serviceConfig(nil).HTTPWork.Timeout)
}

func TestEnvConfigReadsZeroAsNoOrgPendingCap(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		value string
		want  int
	}{{"", workpool.DefaultMaxPendingPerOrg}, {"5", 5}, {" 100000 ", 100_000}, {"0", workpool.NoPendingLimit}} {
		t.Setenv("REVEILLE_ORG_MAX_PENDING", tc.value)
		s, err := envConfig()
		require.NoError(t, err, tc.value)
		require.Equal(t, tc.want, s.workpoolConfig().MaxPendingPerOrg, tc.value)
	}
}

// REVEILLE_OPS_ADDR gives the API config its ops address; unset, there is
// none (the probes and /metrics stay on the API's address).
func TestEnvConfigReadsTheOpsAddress(t *testing.T) {
	clearEnv(t)
	s, err := envConfig()
	require.NoError(t, err)
	require.Empty(t, s.serviceConfig(nil).API.OpsAddr)
	t.Setenv("REVEILLE_OPS_ADDR", "127.0.0.1:9090")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9090", s.serviceConfig(nil).API.OpsAddr)
}

// Zero turns the per-org stream cap and the connection bound off, as it
// turns the pending cap off; unset keeps their defaults (the connection
// bound's is api's: half the open-file limit).
func TestEnvConfigReadsZeroAsNoStreamCapAndNoConnectionBound(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		value               string
		streams, connBounds int
	}{{"", api.DefaultOrgMaxStreams, 0}, {"7", 7, 7}, {"0", -1, -1}} {
		t.Setenv("REVEILLE_ORG_MAX_STREAMS", tc.value)
		t.Setenv("REVEILLE_MAX_CONNECTIONS", tc.value)
		s, err := envConfig()
		require.NoError(t, err, tc.value)
		c := s.serviceConfig(nil).API
		require.Equal(t, tc.streams, c.OrgMaxStreams, tc.value)
		require.Equal(t, tc.connBounds, c.MaxConnections, tc.value)
	}
	for _, name := range []string{"REVEILLE_ORG_MAX_STREAMS", "REVEILLE_MAX_CONNECTIONS"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, "-1")
			_, err := envConfig()
			require.ErrorContains(t, err, name+`="-1": want an integer ≥ 0 (0 turns the cap off)`)
		})
	}
}

func TestEnvConfigHandsTheStreamsTheirTypedConfig(t *testing.T) {
	clearEnv(t)
	s, err := envConfig()
	require.NoError(t, err)
	d := streams.Config{}.WithDefaults()
	require.Equal(t, streams.Config{MaxChunk: d.MaxChunk, MaxRequest: d.MaxRequest, MaxChunksPerRequest: d.MaxChunksPerRequest,
		Retention: d.Retention}, s.streamsConfig(), "unset variables keep the streams' defaults")

	t.Setenv("REVEILLE_STREAM_MAX_CHUNK", "2048")
	t.Setenv("REVEILLE_STREAM_MAX_REQUEST", "4096")
	t.Setenv("REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST", "20")
	t.Setenv("REVEILLE_STREAM_RETENTION", "48h")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, streams.Config{MaxChunk: 2048, MaxRequest: 4096, MaxChunksPerRequest: 20, Retention: 48 * time.Hour}, s.streamsConfig())
}

func TestEnvConfigHandsTheRetentionItsTypedConfigAndTheAPIItsWindow(t *testing.T) {
	clearEnv(t)
	s, err := envConfig()
	require.NoError(t, err)
	week := 7 * 24 * time.Hour
	require.Equal(t, retention.Config{SpendKeys: 24 * time.Hour, MandateApprovals: week, Wakeups: week, ToolApprovals: week,
		QueueMessages: week, SessionEvents: week, ApprovalEvents: week, Interval: 10 * time.Minute}, s.serviceConfig(nil).Retention, "the README's defaults")
	require.Equal(t, 24*time.Hour, s.serviceConfig(nil).API.IdempotencyRetention)

	for name, v := range map[string]string{"REVEILLE_IDEMPOTENCY_RETENTION": "36h", "REVEILLE_SPEND_KEY_RETENTION": "48h",
		"REVEILLE_MANDATE_APPROVAL_RETENTION": "1h", "REVEILLE_WAKEUP_RETENTION": "2h", "REVEILLE_TOOL_APPROVAL_RETENTION": "3h",
		"REVEILLE_QUEUE_RETENTION": "4h", "REVEILLE_SESSION_EVENT_RETENTION": "5h", "REVEILLE_APPROVAL_EVENT_RETENTION": "6h", "REVEILLE_RETENTION_INTERVAL": "1m"} {
		t.Setenv(name, v)
	}
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, retention.Config{SpendKeys: 48 * time.Hour, MandateApprovals: time.Hour, Wakeups: 2 * time.Hour,
		ToolApprovals: 3 * time.Hour, QueueMessages: 4 * time.Hour, SessionEvents: 5 * time.Hour, ApprovalEvents: 6 * time.Hour, Interval: time.Minute},
		s.serviceConfig(nil).Retention)
	require.Equal(t, 36*time.Hour, s.serviceConfig(nil).API.IdempotencyRetention)
}

// Every malformed value stops the service at start with an error that
// names the variable and the value.
func TestEnvConfigNamesTheMalformedVariable(t *testing.T) {
	for _, tc := range []struct{ name, value, contains string }{
		{"REVEILLE_POOLS", "default", `REVEILLE_POOLS: pools "default"`},
		{"REVEILLE_POOLS", "default=0", "REVEILLE_POOLS"},
		{"REVEILLE_POOLS", "a=1,a=2", "given twice"},
		{"REVEILLE_RECOVERY_PERIOD", "soon", `REVEILLE_RECOVERY_PERIOD="soon"`},
		{"REVEILLE_HEARTBEAT_TIMEOUT", "-1s", "REVEILLE_HEARTBEAT_TIMEOUT"},
		{"REVEILLE_HEARTBEAT_TIMEOUT", "1ms", "REVEILLE_HEARTBEAT_TIMEOUT=1ms: want at least 3s"},
		{"REVEILLE_HEARTBEAT_TIMEOUT", "2.999s", "REVEILLE_HEARTBEAT_TIMEOUT=2.999s: want at least 3s"},
		{"REVEILLE_WORK_RETENTION", "1 day", "REVEILLE_WORK_RETENTION"},
		{"REVEILLE_ORG_MAX_PENDING", "-1", `REVEILLE_ORG_MAX_PENDING="-1"`},
		{"REVEILLE_ORG_MAX_PENDING", "many", "REVEILLE_ORG_MAX_PENDING"},
		{"REVEILLE_ORG_MAX_PENDING", "1.5", "REVEILLE_ORG_MAX_PENDING"},
		{"REVEILLE_STREAM_MAX_CHUNK", "lots", `REVEILLE_STREAM_MAX_CHUNK="lots"`},
		{"REVEILLE_STREAM_MAX_REQUEST", "-1", "REVEILLE_STREAM_MAX_REQUEST"},
		{"REVEILLE_STREAM_RETENTION", "7 days", "REVEILLE_STREAM_RETENTION"},
		{"REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST", "0", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST"},
		{"REVEILLE_STREAM_MAX_CHUNK", "9999999999", "REVEILLE_STREAM_MAX_CHUNK=9999999999: want at most 16777216 (16 MiB)"},
		{"REVEILLE_STREAM_MAX_CHUNK", "9999999", "REVEILLE_STREAM_MAX_CHUNK=9999999 exceeds REVEILLE_STREAM_MAX_REQUEST"},
		{"REVEILLE_WORKER", "yes please", "REVEILLE_WORKER"},
		{"REVEILLE_WAKEUP_RETENTION", "a week", `REVEILLE_WAKEUP_RETENTION="a week"`},
		{"REVEILLE_IDEMPOTENCY_RETENTION", "0s", "REVEILLE_IDEMPOTENCY_RETENTION"},
		{"REVEILLE_HOOK_TIMEOUT", "600h", "REVEILLE_HOOK_TIMEOUT=600h0m0s: want at most 1h0m0s"},
		{"REVEILLE_HOOK_TIMEOUT", "0s", "REVEILLE_HOOK_TIMEOUT"},
		{"REVEILLE_HTTP_TIMEOUT", "-5s", "REVEILLE_HTTP_TIMEOUT"},
		{"REVEILLE_LOG_LEVEL", "verbose", `REVEILLE_LOG_LEVEL="verbose": want one of debug, info, warn, error`},
		{"REVEILLE_LOG_LEVEL", "info+2", "REVEILLE_LOG_LEVEL"},
		{"REVEILLE_ADDR", "bad:addr:x", `REVEILLE_ADDR="bad:addr:x": want a listen address host:port`},
		{"REVEILLE_ADDR", "8080", `REVEILLE_ADDR="8080"`},
		{"REVEILLE_ADDR", ":99999", `REVEILLE_ADDR=":99999": port "99999": want a number from 0 to 65535`},
		{"REVEILLE_ADDR", ":no-such-service", `REVEILLE_ADDR=":no-such-service"`},
		{"REVEILLE_OPS_ADDR", "9090", `REVEILLE_OPS_ADDR="9090": want a listen address host:port`},
		{"REVEILLE_JWKS_URL", "idp.example.com/jwks", `REVEILLE_JWKS_URL="idp.example.com/jwks": want an absolute http(s) URL`},
		{"REVEILLE_JWKS_URL", "file:///etc/jwks.json", "REVEILLE_JWKS_URL"},
		{"REVEILLE_JWKS_URL", "https://", "REVEILLE_JWKS_URL"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.name, tc.value)
			_, err := envConfig()
			require.ErrorContains(t, err, tc.contains)
		})
	}
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

func TestEngineTokenRefusesATokenTheServerWouldRefuse(t *testing.T) {
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--org", strings.Repeat("o", 256)}, "cannot sign the token: the org_id claim is 256 bytes long; at most 255 are allowed"},
		{[]string{"--org", "o", "--agent", "  "}, "cannot sign the token: the agent_id claim is blank"},
		{[]string{"--org", "o", "--ttl", "-1h"}, "cannot sign the token: the token's lifetime is -1h0m0s; it must be positive"},
	} {
		require.EqualError(t, runToken(context.Background(), tc.args), tc.want, "%q", tc.args)
	}
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

// The README's configuration table and `engine serve --help` list every
// variable the engine reads.
func TestEveryVariableIsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	flagsOnly := []string{"REVEILLE_ADDR", "REVEILLE_DATA_DIR", "REVEILLE_API_URL"} // in the flags' help instead
	for _, name := range envNames(t) {
		require.True(t, strings.Contains(string(readme), "`"+name+"`"), "README's configuration table lacks %s", name)
		if !slices.Contains(flagsOnly, name) {
			require.True(t, strings.Contains(serveEnvHelp, "  "+name+" "), "engine serve --help lacks %s", name)
		}
	}
}

// Only cmd/engine reads the environment: the packages it wires take typed
// config (internal/testkit, test infrastructure, reads its own
// REVEILLE_TEST_* variables).
func TestOnlyTheEngineCommandReadsTheEnvironment(t *testing.T) {
	allowed := []string{"cmd/engine", "internal/testkit"}
	fset := token.NewFileSet()
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("../..", path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || slices.Contains(allowed, filepath.ToSlash(rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "os" && slices.Contains([]string{"Getenv", "LookupEnv", "Environ", "ExpandEnv"}, n.Sel.Name) {
					t.Errorf("%s: os.%s: take the value in a typed config from cmd/engine instead", fset.Position(n.Pos()), n.Sel.Name)
				}
			case *ast.FuncDecl:
				if strings.Contains(n.Name.Name, "FromEnv") {
					t.Errorf("%s: %s parses the environment: cmd/engine/config.go does, once", fset.Position(n.Pos()), n.Name.Name)
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
}

// REVEILLE_SHUTDOWN_GRACE reaches the service, which gives it to the pool's
// drain; unset, it is the documented 30 s.
func TestEnvConfigHandsTheServiceTheShutdownGrace(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want time.Duration
	}{
		{env: "", want: 30 * time.Second},
		{env: "5s", want: 5 * time.Second},
		{env: "2m", want: 2 * time.Minute},
	} {
		t.Run(cmp.Or(tc.env, "unset"), func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_SHUTDOWN_GRACE", tc.env)
			s, err := envConfig()
			require.NoError(t, err)
			require.Equal(t, tc.want, s.serviceConfig(nil).ShutdownGrace)
		})
	}
	for _, bad := range []string{"0", "-1s", "soon"} {
		t.Run("rejects "+bad, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_SHUTDOWN_GRACE", bad)
			_, err := envConfig()
			require.ErrorContains(t, err, "REVEILLE_SHUTDOWN_GRACE")
		})
	}
}

// REVEILLE_LOG_LEVEL takes the README's four levels in any case; unset, the
// command picks its default.
func TestEnvConfigReadsTheLogLevel(t *testing.T) {
	for _, tc := range []struct{ env, want string }{{"", ""}, {"debug", "debug"}, {"WARN", "warn"}, {" error ", "error"}, {"info", "info"}} {
		t.Run(cmp.Or(tc.env, "unset"), func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_LOG_LEVEL", tc.env)
			s, err := envConfig()
			require.NoError(t, err)
			require.Equal(t, tc.want, s.LogLevel)
			require.NotPanics(t, func() { newLogger(s.LogLevel) })
		})
	}
}

// serve checks the log level before it touches Postgres or Temporal: a
// typo is not a silent info.
func TestServeRefusesToStartWithAnUnknownLogLevel(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
	t.Setenv("REVEILLE_LOG_LEVEL", "verbose")

	err := runServe(context.Background(), nil)

	require.ErrorContains(t, err, `REVEILLE_LOG_LEVEL="verbose": want one of debug, info, warn, error`)
}

// A listen address serve could not listen on stops it before it touches
// the database (never dialled here), named by the variable or the flag
// that set it; a good one is kept as given.
func TestServeRefusesABadListenAddressBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		contains  string
	}{
		{"variable", "bad:addr:x", nil, `REVEILLE_ADDR="bad:addr:x"`},
		{"flag", "", []string{"--addr", "bad:addr:x"}, `invalid value "bad:addr:x" for flag -addr: want a listen address host:port`},
		{"flag over a good variable", ":8080", []string{"--addr=:70000"}, `flag -addr: port "70000"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
			t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
			t.Setenv("REVEILLE_ADDR", tc.env)
			err := runServe(context.Background(), tc.args)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	for _, good := range []string{":8080", "127.0.0.1:0", "[::1]:8080", "localhost:http", "0.0.0.0:65535", "127.0.0.1:"} {
		t.Run("accepts "+good, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_ADDR", good)
			s, err := envConfig()
			require.NoError(t, err)
			require.Equal(t, good, s.Addr)
		})
	}
}

func TestEnvConfigAcceptsAnHTTPSOrHTTPJWKSURL(t *testing.T) {
	for _, good := range []string{"https://idp.example.com/.well-known/jwks.json", "http://127.0.0.1:9000/jwks?kid=a"} {
		clearEnv(t)
		t.Setenv("REVEILLE_JWKS_URL", good)
		s, err := envConfig()
		require.NoError(t, err, good)
		require.Equal(t, good, s.JWKSURL)
	}
}

// Every duration setting has a least value, named with the variable in the
// error: REVEILLE_RETENTION_INTERVAL=1ms started and spun the purge back to
// back, REVEILLE_RECOVERY_PERIOD=1ns was accepted. The bound itself is
// accepted.
func TestEnvConfigRefusesADurationBelowItsBound(t *testing.T) {
	oneSecond := []string{"REVEILLE_READ_HEADER_TIMEOUT", "REVEILLE_READ_TIMEOUT", "REVEILLE_WRITE_TIMEOUT", "REVEILLE_IDLE_TIMEOUT",
		"REVEILLE_HTTP_TIMEOUT", "REVEILLE_HOOK_TIMEOUT", "REVEILLE_WORK_RETENTION", "REVEILLE_APPROVAL_TTL", "REVEILLE_TOOL_APPROVAL_TTL",
		"REVEILLE_SIGNAL_NOTFOUND_GRACE", "REVEILLE_STREAM_RETENTION", "REVEILLE_SHUTDOWN_GRACE", "REVEILLE_IDEMPOTENCY_RETENTION",
		"REVEILLE_SPEND_KEY_RETENTION", "REVEILLE_MANDATE_APPROVAL_RETENTION", "REVEILLE_WAKEUP_RETENTION", "REVEILLE_TOOL_APPROVAL_RETENTION",
		"REVEILLE_QUEUE_RETENTION", "REVEILLE_SESSION_EVENT_RETENTION", "REVEILLE_APPROVAL_EVENT_RETENTION", "REVEILLE_RETENTION_INTERVAL"}
	type bound struct {
		name, below, least string
	}
	bounds := []bound{
		{"REVEILLE_RECOVERY_PERIOD", "1ns", "100ms"},
		{"REVEILLE_RECOVERY_PERIOD", "99ms", "100ms"},
		{"REVEILLE_HEARTBEAT_TIMEOUT", "2.999s", "3s"},
	}
	for _, name := range oneSecond {
		bounds = append(bounds, bound{name, "1ms", "1s"}, bound{name, "999ms", "1s"})
	}
	for _, b := range bounds {
		t.Run(b.name+"="+b.below+" is refused", func(t *testing.T) {
			clearEnv(t)
			t.Setenv(b.name, b.below)
			_, err := envConfig()
			require.ErrorContains(t, err, b.name+"="+b.below+": want at least "+b.least)
		})
		t.Run(b.name+"="+b.least+" is accepted", func(t *testing.T) {
			clearEnv(t)
			t.Setenv(b.name, b.least)
			_, err := envConfig()
			require.NoError(t, err)
		})
	}
	t.Run("the README documents every duration's bound", func(t *testing.T) {
		readme, err := os.ReadFile("../../README.md")
		require.NoError(t, err)
		for _, b := range bounds {
			row := regexp.MustCompile("(?m)^\\| `" + b.name + "` \\|.*$").FindString(string(readme))
			require.Contains(t, row, "at least `"+b.least+"`", "README's row for %s", b.name)
		}
	})
}

// serve keeps nothing on disk: it refuses --data-dir as any flag it does
// not take, where it used to accept it and do nothing with it.
func TestServeRefusesTheDataDirFlag(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)

	err := runServe(context.Background(), []string{"--data-dir", t.TempDir()})

	require.EqualError(t, err, "flag provided but not defined: -data-dir")
}

// engine token checks its secrets as serve does, with serve's message, so
// that it never prints a token serve would refuse to verify:
// REVEILLE_JWT_SECRET=short signed a token with a 5-byte secret.
func TestEngineTokenRefusesTheSecretsServeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, secrets, jwks string
		want                string
	}{
		{"a short secret", "short", "", "auth: REVEILLE_JWT_SECRET must be at least 32 bytes: secret 1 of 1 has 5"},
		{"a short secret among several", firstSecret + ",too-short", "", "secret 2 of 2"},
		{"a secret and a JWKS", firstSecret, "https://idp.invalid/jwks", "not both"},
		{"a JWKS without issuer or audience", "", "https://idp.invalid/jwks", "REVEILLE_JWKS_URL needs REVEILLE_JWT_ISSUER and REVEILLE_JWT_AUDIENCE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("DATABASE_URL", "postgres://never-dialled.invalid/reveille")
			t.Setenv("REVEILLE_DATA_DIR", t.TempDir())
			t.Setenv("REVEILLE_JWT_SECRET", tc.secrets)
			t.Setenv("REVEILLE_JWKS_URL", tc.jwks)

			tokenErr := runToken(context.Background(), []string{"--org", "acme"})
			serveErr := runServe(context.Background(), nil)

			require.ErrorContains(t, tokenErr, tc.want)
			require.EqualError(t, tokenErr, serveErr.Error(), "the same message as serve")
		})
	}
	t.Run("a JWKS alone: no secret to sign with", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("REVEILLE_JWKS_URL", "https://idp.invalid/jwks")
		t.Setenv("REVEILLE_JWT_ISSUER", "https://idp.invalid")
		t.Setenv("REVEILLE_JWT_AUDIENCE", "reveille")

		err := runToken(context.Background(), []string{"--org", "acme"})

		require.ErrorContains(t, err, "REVEILLE_JWKS_URL is set: tokens come from its identity provider")
	})
}

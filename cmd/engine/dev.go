package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/devstack/localstack"
)

// devOrg is the org of the token `engine dev` prints; its operator role counts.
const devOrg = "dev-org"

// devHTTPAllowed is the allow-list of `engine dev` and the demo: any port
// on this machine, as their targets listen on random ports.
var devHTTPAllowed = []string{"localhost:*", "127.0.0.1:*"}

func runDev(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	s.bindFlags(fs, true)
	fs.Usage = func() {
		flagUsage(fs, "engine dev [flags]", "  As for serve (engine serve --help); unset DATABASE_URL / TEMPORAL_ADDRESS start local ones.\n")
	}
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := overridden(envErr, fs, flagVars); err != nil {
		return err
	}
	logger := startLogging(s.LogLevel)
	if len(s.OperatorOrgs) == 0 {
		s.OperatorOrgs = []string{devOrg}
	}
	if len(s.HTTPAllowed) == 0 {
		s.HTTPAllowed = devHTTPAllowed
	}
	s.Worker = true
	// What can be checked without the stack is checked before it starts
	// (README: a bad value stops the command before it connects to anything).
	if len(s.JWTSecrets) > 0 || s.JWKSURL != "" {
		if err := s.authConfig().Validate(); err != nil {
			return err
		}
	}
	if s.DatabaseURL != "" {
		if _, err := pgxpool.ParseConfig(s.DatabaseURL); err != nil {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
	}

	stack, err := startStack(ctx, &s, "", "dev", logger)
	if err != nil {
		return err
	}
	defer stack.Stop()

	secretPath := "(REVEILLE_JWT_SECRET)"
	if len(s.JWTSecrets) == 0 && s.JWKSURL == "" {
		secret, path, err := localstack.DevSecret(s.DataDir)
		if err != nil {
			return err
		}
		s.JWTSecrets, secretPath = []string{secret}, path
	}
	if err := s.authConfig().Validate(); err != nil {
		return err
	}
	return serve(ctx, s, logger, func(bound net.Addr) {
		// --addr :0 listens on a free port: the banner names that one.
		if host, _, err := net.SplitHostPort(s.Addr); err == nil {
			if tcp, ok := bound.(*net.TCPAddr); ok {
				s.Addr = net.JoinHostPort(host, strconv.Itoa(tcp.Port))
			}
		}
		if s.JWKSURL != "" {
			printDevInfo(s, secretPath, "(JWKS configured: bring your own token)")
			return
		}
		tok, err := api.SignToken([]byte(s.signingSecret()), api.TokenSpec{OrgID: devOrg, Sub: "dev-user", Roles: api.AllRoles,
			TTL: 24 * time.Hour, Issuer: s.JWTIssuer, Audience: s.JWTAudience})
		if err != nil {
			tok = "(could not sign: " + err.Error() + ")"
		}
		printDevInfo(s, secretPath, tok)
		link, err := devInboxLink(s)
		if err != nil {
			link = "(could not sign: " + err.Error() + ")"
		}
		fmt.Printf("  approvals inbox (signed in as %s, approver of org %s, 24h):\n  %s\n\n", devApprover, devOrg, link)
	})
}

// devApprover is the sub of the inbox link's token: not dev-user, whose
// token makes the demo's requests, since no one may answer their own.
const devApprover = "dev-approver"

// devInboxLink is the inbox page's address with an approver token in its
// fragment, which the browser never sends: the page reads it, keeps it in
// the tab's session storage and removes it from the address bar.
func devInboxLink(s settings) (string, error) {
	tok, err := api.SignToken([]byte(s.signingSecret()), api.TokenSpec{OrgID: devOrg, Sub: devApprover, Roles: []string{api.RoleApprover},
		TTL: 24 * time.Hour, Issuer: s.JWTIssuer, Audience: s.JWTAudience})
	if err != nil {
		return "", err
	}
	return apiURL(s.Addr) + "/inbox#token=" + tok, nil
}

// startStack starts what s lacks: Postgres when DATABASE_URL is unset,
// Temporal when TEMPORAL_ADDRESS is unset (only = "postgres"/"temporal"
// restricts it to one), and fills s with their addresses. command names
// this process in the error a second one gets while it holds the data dir.
func startStack(ctx context.Context, s *settings, only, command string, logger *slog.Logger) (*localstack.Stack, error) {
	st, err := localstack.Start(ctx, localstack.Options{
		DataDir: s.DataDir, Postgres: s.DatabaseURL == "" && only != "temporal", Temporal: s.TemporalAddr == "" && only != "postgres",
		TemporalPort: s.TemporalPort, PostgresPort: s.PostgresPort, Namespace: s.Namespace, Holder: "engine " + command, Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	s.DatabaseURL = cmp.Or(st.DatabaseURL(), s.DatabaseURL)
	s.TemporalAddr = cmp.Or(st.TemporalAddress(), s.TemporalAddr)
	return st, nil
}

func printDevInfo(s settings, secretPath, token string) {
	url := apiURL(s.Addr)
	fmt.Printf(`
Reveille dev is running.

  API               %s
  DATABASE_URL=%s
  TEMPORAL_ADDRESS=%s
  dev secret        %s
  dev token (org %s, all roles, 24h):
%s

  curl -s -H "Authorization: Bearer %s" %s/v1/whoami

`, url, redactedDatabaseURL(s.DatabaseURL), s.TemporalAddr, secretPath, devOrg, token, token, url)
}

// redactedDatabaseURL is a connection string as the dev banner prints it:
// the password masked as pgx masks it in its errors and httpwork in its own
// (url.Redacted: postgres://user:xxxxx@host/db), and one given as a
// parameter (?password=, ?sslpassword=, or password=… in the key=value
// form) too. The rest is kept, sslmode included: the local cluster's URL,
// which has no password, stays one to copy. A supplied DATABASE_URL's
// password went to the terminal and its scrollback in clear.
func redactedDatabaseURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return dsnPassword.ReplaceAllString(raw, "${1}=xxxxx")
	}
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, part := range parts {
			name, _, _ := strings.Cut(part, "=")
			if n, err := url.QueryUnescape(name); err == nil && (strings.EqualFold(n, "password") || strings.EqualFold(n, "sslpassword")) {
				parts[i] = name + "=xxxxx"
			}
		}
		c := *u
		c.RawQuery = strings.Join(parts, "&")
		u = &c
	}
	return u.Redacted()
}

// dsnPassword is a password in a key=value connection string, quoted as
// libpq quotes it ('a b', 'it\'s') or not.
var dsnPassword = regexp.MustCompile(`(?i)\b((?:ssl)?password)\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^\s]+)`)

func apiURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

func runDevstack(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.StringVar(&s.DataDir, "data-dir", s.DataDir, "data directory (REVEILLE_DATA_DIR)")
	fs.Var(portFlag{&s.TemporalPort}, "temporal-port", "frontend `port` of the embedded Temporal dev server (0: a free one)")
	// A fixed port lets a stopped devstack come back where its clients
	// look for it (the fault suite restarts Postgres under running replicas).
	fs.Var(portFlag{&s.PostgresPort}, "postgres-port", "`port` of the local Postgres at 127.0.0.1 (0: a free one; a Postgres left running keeps its own)")
	only := fs.String("only", "", "run only one part: postgres or temporal")
	fs.Usage = func() { flagUsage(fs, "engine devstack [--only postgres|temporal] [flags]", "") }
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if envErr != nil {
		return envErr
	}
	if *only != "" && *only != "postgres" && *only != "temporal" {
		return fmt.Errorf("--only: want postgres or temporal, not %q", *only)
	}
	// devstack starts its own parts whatever the environment says.
	s.DatabaseURL, s.TemporalAddr = "", ""
	st, err := startStack(ctx, &s, *only, "devstack", startLogging(s.LogLevel))
	if err != nil {
		return err
	}
	defer st.Stop()
	var lines []string
	if st.DatabaseURL() != "" {
		lines = append(lines, "DATABASE_URL="+s.DatabaseURL)
	}
	if st.TemporalAddress() != "" {
		lines = append(lines, "TEMPORAL_ADDRESS="+s.TemporalAddr, "TEMPORAL_NAMESPACE="+s.Namespace)
	}
	fmt.Println(strings.Join(lines, "\n"))
	select {
	case <-ctx.Done():
	case <-st.PostgresExited():
		return st.PostgresExit()
	}
	return nil
}

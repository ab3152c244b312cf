package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/devstack/devtemporal"
)

// devOrg is the org of the token `engine dev` prints; its operator role counts.
const devOrg = "dev-org"

func runDev(ctx context.Context, args []string) error {
	s, err := envConfig()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	s.bindFlags(fs, true)
	fs.Usage = func() {
		flagUsage(fs, "engine dev [flags]", "  As for serve (engine serve --help); unset DATABASE_URL / TEMPORAL_ADDRESS start local ones.\n")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := newLogger(s.LogLevel)
	if len(s.OperatorOrgs) == 0 {
		s.OperatorOrgs = []string{devOrg}
	}
	if len(s.HTTPAllowed) == 0 {
		s.HTTPAllowed = devHTTPAllowed
	}
	s.Worker = true

	stack, err := startStack(ctx, &s, "", "dev", logger)
	if err != nil {
		return err
	}
	defer stack.stop()

	secretPath := "(REVEILLE_JWT_SECRET)"
	if len(s.JWTSecrets) == 0 && s.JWKSURL == "" {
		secret, path, err := devSecret(s.DataDir)
		if err != nil {
			return err
		}
		s.JWTSecrets, secretPath = []string{secret}, path
	}
	if err := s.authConfig().Validate(); err != nil {
		return err
	}
	return serve(ctx, s, logger, func(net.Addr) {
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
	})
}

// stack is the local infrastructure dev and devstack start.
type stack struct {
	lock     *devstack.DataDirLock
	pg       *devstack.Postgres
	temporal *devtemporal.Server
}

func (st *stack) stop() {
	if st.temporal != nil {
		_ = st.temporal.Stop()
	}
	if st.pg != nil {
		_ = st.pg.Stop(context.Background())
	}
	_ = st.lock.Release()
}

// startStack starts what s lacks: Postgres when DATABASE_URL is unset,
// Temporal when TEMPORAL_ADDRESS is unset (only = "postgres"/"temporal"
// restricts it to one), and fills s with their addresses. It holds the data
// dir's lock until stop, so a second process (command names it) fails at
// once instead of running a second Temporal on the SQLite file or stopping
// the first one's Postgres when it exits.
func startStack(ctx context.Context, s *settings, only, command string, logger interface {
	Info(string, ...any)
}) (*stack, error) {
	st := &stack{}
	startsPostgres := s.DatabaseURL == "" && only != "temporal"
	startsTemporal := s.TemporalAddr == "" && only != "postgres"
	if startsPostgres || startsTemporal {
		lock, err := devstack.LockDataDir(s.DataDir, "engine "+command)
		if errors.Is(err, devstack.ErrDataDirInUse) {
			return nil, fmt.Errorf("%w; stop it or use --data-dir", err)
		}
		if err != nil {
			return nil, err
		}
		st.lock = lock
	}
	if startsPostgres {
		pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: s.DataDir})
		if err != nil {
			st.stop()
			return nil, fmt.Errorf("local Postgres: %w", err)
		}
		st.pg = pg
		if err := pg.EnsureDatabase(ctx, "reveille"); err != nil {
			st.stop()
			return nil, err
		}
		s.DatabaseURL = pg.URL("reveille")
		logger.Info("postgres ready", "url", s.DatabaseURL, "reused", pg.Reused())
	}
	if startsTemporal {
		t, err := devtemporal.Start(ctx, devtemporal.Options{
			DataDir: filepath.Join(s.DataDir, "temporal"), Port: s.TemporalPort, Namespace: s.Namespace,
		})
		if err != nil {
			st.stop()
			return nil, fmt.Errorf("embedded Temporal: %w", err)
		}
		st.temporal = t
		s.TemporalAddr = t.Address()
		logger.Info("temporal ready", "address", s.TemporalAddr, "namespace", s.Namespace)
	}
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

`, url, s.DatabaseURL, s.TemporalAddr, secretPath, devOrg, token, token, url)
}

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
	s, err := envConfig()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.StringVar(&s.DataDir, "data-dir", s.DataDir, "data directory (REVEILLE_DATA_DIR)")
	fs.IntVar(&s.TemporalPort, "temporal-port", s.TemporalPort, "frontend port of the embedded Temporal dev server")
	only := fs.String("only", "", "run only one part: postgres or temporal")
	fs.Usage = func() { flagUsage(fs, "engine devstack [--only postgres|temporal] [flags]", "") }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *only != "" && *only != "postgres" && *only != "temporal" {
		return fmt.Errorf("--only: want postgres or temporal, not %q", *only)
	}
	// devstack starts its own parts whatever the environment says.
	s.DatabaseURL, s.TemporalAddr = "", ""
	st, err := startStack(ctx, &s, *only, "devstack", newLogger(s.LogLevel))
	if err != nil {
		return err
	}
	defer st.stop()
	var lines []string
	if st.pg != nil {
		lines = append(lines, "DATABASE_URL="+s.DatabaseURL)
	}
	if st.temporal != nil {
		lines = append(lines, "TEMPORAL_ADDRESS="+s.TemporalAddr, "TEMPORAL_NAMESPACE="+s.Namespace)
	}
	fmt.Println(strings.Join(lines, "\n"))
	select {
	case <-ctx.Done():
	case <-st.pgExited():
		return fmt.Errorf("postgres exited")
	}
	return nil
}

func (st *stack) pgExited() <-chan struct{} {
	if st.pg == nil {
		return make(chan struct{})
	}
	return st.pg.Wait()
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/devstack/localstack"
)

func runToken(_ context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	org := fs.String("org", "", "org_id claim (required)")
	roles := fs.String("roles", "admin,agent,approver", "comma list of roles: admin, agent, approver, operator")
	sub := fs.String("sub", "dev-user", "sub claim")
	agent := fs.String("agent", "", "agent_id claim: the token may act only as this agent")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime")
	dataDir := fs.String("data-dir", s.DataDir, "data dir holding the dev secret (used when REVEILLE_JWT_SECRET is unset)")
	fs.Usage = func() {
		flagUsage(fs, "engine token --org ORG [--roles admin,agent,approver] [--sub S] [--agent A] [--ttl 24h] [--data-dir D]",
			"  REVEILLE_JWT_SECRET  signs the token (its first secret when it lists several; each at least 32 bytes, as serve wants);\n"+
				"                       else the dev secret in the data dir\n")
	}
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if envErr != nil {
		return envErr
	}
	if *org == "" {
		return errors.New("--org is required")
	}
	var rs []string
	for _, r := range list(*roles) {
		known := false
		for _, k := range api.AllRoles {
			known = known || r == k
		}
		if !known {
			return fmt.Errorf("--roles: unknown role %q (want %s)", r, strings.Join(api.AllRoles, ", "))
		}
		rs = append(rs, r)
	}
	if len(s.JWTSecrets) == 0 && s.JWKSURL == "" {
		secret, err := localstack.ReadDevSecret(*dataDir)
		if err != nil {
			return fmt.Errorf("no REVEILLE_JWT_SECRET and no dev secret in %s (run engine dev first): %w", *dataDir, err)
		}
		s.JWTSecrets = []string{secret}
	}
	// The check serve starts with, so that no token is printed that serve
	// would refuse to verify (REVEILLE_JWT_SECRET=short signed with 5 bytes).
	if err := s.authConfig().Validate(); err != nil {
		return err
	}
	if len(s.JWTSecrets) == 0 {
		return errors.New("REVEILLE_JWKS_URL is set: tokens come from its identity provider (engine token signs with REVEILLE_JWT_SECRET only)")
	}
	// The first of REVEILLE_JWT_SECRET's secrets signs; the others only
	// verify (they are on their way in or out).
	tok, err := api.SignToken([]byte(s.signingSecret()), api.TokenSpec{OrgID: *org, Sub: *sub, Roles: rs, AgentID: *agent, TTL: *ttl,
		Issuer: s.JWTIssuer, Audience: s.JWTAudience})
	if err != nil {
		// (the claims come from --org, --sub and --agent, the lifetime from --ttl)
		return fmt.Errorf("cannot sign the token: %w", err)
	}
	fmt.Println(tok)
	return nil
}

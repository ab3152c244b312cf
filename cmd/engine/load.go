package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/reveille/reveille/internal/devstack/localstack"
	"github.com/reveille/reveille/internal/load"
	"github.com/reveille/reveille/internal/service"
)

// runLoad drives a running engine's REST API as an agent platform would
// and reports every wake-up its workflows did not get.
func runLoad(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	c := load.Config{Org: devOrg, Namespace: s.Namespace, Issuer: s.JWTIssuer, Audience: s.JWTAudience, Logger: newLogger(cmp.Or(s.LogLevel, "error"))}
	apis := fs.String("api", s.APIURL, "API URL(s) of the engine, comma-separated: the clients are spread over them, and a call a replica does not answer goes to the next (REVEILLE_API_URL)")
	fs.StringVar(&c.Token, "token", "", "token of the agent platform: agent and admin of its org (default: one like engine dev's, signed with the dev secret)")
	fs.StringVar(&c.ApproverToken, "approver-token", "", "token of the human who approves refused spends and tool calls: approver of the same org, another sub (default: sub dev-approver, signed with the dev secret)")
	fs.StringVar(&c.TemporalAddress, "temporal", cmp.Or(s.TemporalAddr, service.DefaultTemporalAddress), "Temporal frontend of the engine (TEMPORAL_ADDRESS); the load's own worker polls it")
	fs.IntVar(&c.Wakeups, "wakeups", 20000, "wake-ups to ask for")
	fs.IntVar(&c.Clients, "clients", 64, "concurrent clients, each asking for its next wake-up once its last one woke")
	fs.IntVar(&c.ApprovalsEvery, "approvals-every", 10, "every N-th wake-up's workflow first asks for a tool call that the approver approves (0: none)")
	fs.IntVar(&c.RefuseEvery, "refuse-every", 20, "every N-th wake-up is refused by the budget (402) and approved (-1: none)")
	fs.IntVar(&c.CancelEvery, "cancel-every", 20, "every N-th wake-up runs work that holds until the client cancels the wake-up (-1: none)")
	fs.DurationVar(&c.Deadline, "deadline", 2*time.Minute, "how long a wake-up may take to wake its workflow, from the request that settled it, before it counts as lost")
	fs.DurationVar(&c.Progress, "progress", 5*time.Second, "how often a progress line is printed")
	fs.StringVar(&c.TargetAddr, "target", "127.0.0.1:0", "listen address of the HTTP service the wake-ups' work calls (the engine must be allowed to call it: REVEILLE_HTTP_ALLOWED_HOSTS)")
	fs.StringVar(&s.DataDir, "data-dir", s.DataDir, "data dir of engine dev, whose secret signs the default tokens (REVEILLE_DATA_DIR)")
	fs.Usage = func() {
		flagUsage(fs, "engine load [--api URL[,URL…]] [--token T] [--approver-token T] [--temporal HOST:PORT] [--wakeups N] [--clients N] [--approvals-every N]",
			"  REVEILLE_JWT_SECRET  signs the default tokens (else the dev secret in the data dir)\n  TEMPORAL_NAMESPACE   namespace of the load's workflows (default \"default\")\n\nPrints a progress line every --progress and at the end\n  load: wakeups=… woken=… lost=… duplicates_deduped=… p50=…ms p99=…ms errors=…\nand exits 1 when a wake-up was lost, woke with the wrong outcome, or was never accepted (errors).\n")
	}
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := overridden(envErr, fs, flagVars); err != nil {
		return err
	}
	if err := checkAPIURLs(*apis); err != nil {
		return err
	}
	// (before the API is called: a malformed address is named at once)
	if err := checkTemporalAddr(c.TemporalAddress); err != nil {
		return fmt.Errorf("--temporal %q: %w", c.TemporalAddress, err)
	}
	if err := checkListenAddr(c.TargetAddr); err != nil {
		return fmt.Errorf("--target %q: %w", c.TargetAddr, err)
	}
	c.APIs = list(*apis)
	c.Secret = s.signingSecret()
	if c.Secret == "" && (c.Token == "" || c.ApproverToken == "") {
		c.Secret, _ = localstack.ReadDevSecret(s.DataDir)
	}
	_, err := load.Run(ctx, c)
	return err
}

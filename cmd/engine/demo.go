package main

import (
	"context"
	"flag"
	"net"

	"github.com/reveille/reveille/internal/demo"
	"github.com/reveille/reveille/internal/devstack/localstack"
)

// runDemo runs the reference workflow through a running engine (or one it
// starts) for six cases and prints each one's timeline.
func runDemo(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	apiURL := fs.String("api", s.APIURL, "API of a running engine (REVEILLE_API_URL); started here if it does not answer")
	fs.StringVar(&s.DataDir, "data-dir", s.DataDir, "data dir of the engine (dev secret; and the stack started when none runs)")
	fs.Var(portFlag{&s.TemporalPort}, "temporal-port", "Temporal `port` of the engine started here (0: a free one)")
	fs.Usage = func() {
		flagUsage(fs, "engine demo [--api URL] [--data-dir D]", "  TEMPORAL_ADDRESS  Temporal of the running engine (default 127.0.0.1:7233)\n  REVEILLE_JWT_SECRET  signs the demo's tokens (else the dev secret in the data dir)\n")
	}
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if envErr != nil {
		return envErr
	}
	if err := checkAPIURLs(*apiURL); err != nil {
		return err
	}
	// The engine started here (its Postgres and Temporal with it) runs until
	// the demo ends, and is stopped before the process exits: main does not
	// wait for anything else, and a postmaster would outlive it.
	ctx, cancel := context.WithCancel(ctx)
	var engineStopped <-chan struct{}
	err := demo.Run(ctx, demo.Config{
		APIURL: *apiURL, TemporalAddress: s.TemporalAddr, Namespace: s.Namespace, Org: devOrg,
		Secret: s.signingSecret(), DataDir: s.DataDir, Issuer: s.JWTIssuer, Audience: s.JWTAudience,
		StartEngine: func(ctx context.Context) (demo.Engine, error) {
			e, stopped, err := startDemoEngine(ctx, s)
			engineStopped = stopped
			return e, err
		},
		Logger: newLogger("error"),
	})
	cancel()
	if engineStopped != nil {
		<-engineStopped
	}
	return err
}

// startDemoEngine runs `engine dev` in this process on a free port, until
// ctx ends; stopped is closed once it and the stack it started have
// stopped (nil when nothing was started).
func startDemoEngine(ctx context.Context, s settings) (_ demo.Engine, stopped <-chan struct{}, _ error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demo.Engine{}, nil, err
	}
	s.Addr = ln.Addr().String()
	ln.Close()
	// The demo's work calls a target on a random local port, and its
	// tokens are the dev org's.
	s.OperatorOrgs, s.HTTPAllowed, s.Worker = []string{devOrg}, devHTTPAllowed, true
	logger := newLogger("error")
	st, err := startStack(ctx, &s, "", "demo", logger)
	if err != nil {
		return demo.Engine{}, nil, err
	}
	if len(s.JWTSecrets) == 0 {
		secret, _, err := localstack.DevSecret(s.DataDir)
		if err != nil {
			st.Stop()
			return demo.Engine{}, nil, err
		}
		s.JWTSecrets = []string{secret}
	}
	ready, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		defer st.Stop()
		err := serve(ctx, s, logger, func(net.Addr) { ready <- nil })
		select {
		case ready <- err: // it ended before it listened
		default:
		}
	}()
	if err := <-ready; err != nil {
		return demo.Engine{}, done, err
	}
	return demo.Engine{APIURL: "http://" + s.Addr, TemporalAddress: s.TemporalAddr, Secret: s.signingSecret()}, done, nil
}

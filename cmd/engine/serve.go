package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/reveille/reveille/internal/service"
)

func runServe(ctx context.Context, args []string) error {
	// (a malformed variable is reported after the flags: --help still prints the usage)
	s, envErr := envConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s.bindFlags(fs, false)
	fs.Usage = func() { flagUsage(fs, "engine serve [flags]", serveEnvHelp) }
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := overridden(envErr, fs, flagVars); err != nil {
		return err
	}
	if s.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set (serve uses external Postgres; `engine dev` starts a local one)")
	}
	if s.TemporalAddr == "" {
		s.TemporalAddr = service.DefaultTemporalAddress
	}
	if err := s.authConfig().Validate(); err != nil {
		return err
	}
	return serve(ctx, s, startLogging(s.LogLevel), nil)
}

// serve runs the service built from s until ctx ends. ready, if set, is
// called once the API listens.
func serve(ctx context.Context, s settings, logger *slog.Logger, ready func(net.Addr)) error {
	cfg := s.serviceConfig(logger)
	applyFaultHooks(&cfg, logger)
	svc, err := service.New(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			// A stop asked for while starting (a SIGTERM during a database
			// outage, say) is a stop, not a failure: exit 0, with what the
			// start was waiting on.
			logger.Info("stopped before the start completed", "waiting_on", err.Error())
			return nil
		}
		return err
	}
	defer svc.Close()
	return svc.Run(ctx, ready)
}

// startLogging makes the JSON logger at level the process's default, for
// the commands whose stderr is a JSON log stream (serve, dev, devstack):
// what libraries log to slog.Default (the JWKS refresher) and to the
// standard library's log package goes through it too, as does the
// signal handler's line, so no plain-text line interleaves with the JSON.
func startLogging(level string) *slog.Logger {
	l := newLogger(level)
	slog.SetDefault(l) // also points package log at l's handler
	return l
}

// stderr is where the JSON logs go (a test captures them).
var stderr io.Writer = os.Stderr

// newLogger is the JSON logger on stderr at level: one of logLevels, or ""
// for info (envConfig refuses any other REVEILLE_LOG_LEVEL).
func newLogger(level string) *slog.Logger {
	l := slog.LevelInfo
	if level != "" {
		if err := l.UnmarshalText([]byte(level)); err != nil {
			panic(fmt.Sprintf("log level %q: %v", level, err)) // a level envConfig did not check
		}
	}
	return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l}))
}

// parseArgs parses a command's flags and refuses any argument beyond its
// first positional ones, naming it: the flag package stops at the first
// argument that is not a flag, so a stray one would silently drop itself
// and every flag after it (bench rest --route spend extra --duration 1s
// ran the default 10 s).
func parseArgs(fs *flag.FlagSet, args []string, positional int) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > positional {
		return fmt.Errorf("unexpected argument %q", fs.Arg(positional))
	}
	return nil
}

// flagUsage prints a command's usage: its synopsis, its flags (a command
// with none, as migrate, gets no empty Flags: section) and env, the
// variables it reads.
func flagUsage(fs *flag.FlagSet, synopsis, env string) {
	fmt.Fprintf(fs.Output(), "Usage: %s\n", synopsis)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if env != "" {
		fmt.Fprintf(fs.Output(), "\nEnvironment:\n%s", env)
	}
}

const serveEnvHelp = `  DATABASE_URL                  Postgres connection string (required for serve)
  TEMPORAL_ADDRESS              Temporal frontend host:port (serve default 127.0.0.1:7233)
  TEMPORAL_NAMESPACE            Temporal namespace for signals, which must exist (default "default")
  REVEILLE_OPS_ADDR             a second listen address serving /healthz, /readyz and /metrics alone; /metrics then leaves the API's
  REVEILLE_JWT_SECRET           HS256 secrets, each at least 32 bytes (comma list: the first signs, all verify)
  REVEILLE_JWKS_URL             absolute http(s) JWKS URL for RS256/ES256/EdDSA tokens (instead of the secret)
  REVEILLE_JWT_ISSUER           required iss (required with REVEILLE_JWKS_URL; else checked when set)
  REVEILLE_JWT_AUDIENCE         required aud (required with REVEILLE_JWKS_URL; else checked when set)
  REVEILLE_OPERATOR_ORGS        orgs whose operator role counts (comma list)
  REVEILLE_MAX_BODY             request body limit in bytes (default 1048576)
  REVEILLE_READ_HEADER_TIMEOUT  time a client has to send a request's headers (default 10s)
  REVEILLE_READ_TIMEOUT         time a client has to send a whole request, body included (default 60s)
  REVEILLE_WRITE_TIMEOUT        time to answer a request and write the response; for SSE, each write (default 60s)
  REVEILLE_IDLE_TIMEOUT         how long an idle kept-alive connection stays open (default 120s)
  REVEILLE_ORG_RATE             requests per second per org on this replica, bursts of twice that (default 10000; 0 = no limit)
  REVEILLE_ORG_MAX_STREAMS      live streams (SSE) per org on this replica; past it 429 (default 1000; 0 = no cap)
  REVEILLE_MAX_CONNECTIONS      connections the API server holds open; at it a new one closes an idle one or waits
                                (default: half the open-file limit; 0 = no bound)
  REVEILLE_POOLS                pools created at start if missing; the database needs wakeup (default default=25,wakeup=25)
  REVEILLE_RECOVERY_PERIOD      how often running work is checked for dead executors (default 10s, at least 100ms)
  REVEILLE_HEARTBEAT_TIMEOUT    heartbeat age after which running work is recovered (default 30s, at least 3s)
  REVEILLE_HOOK_TIMEOUT         the most one onComplete hook call may take before it fails and is retried (default 10s, 1s to 1h)
  REVEILLE_HTTP_TIMEOUT         the most one request of the http handler may take (default: unset, the work's timeout_ms alone)
  REVEILLE_WORK_RETENTION       how long finished work records are kept (default 24h)
  REVEILLE_ORG_MAX_PENDING      unfinished work items one org may have in one pool (default 100000; 0 = no cap)
  REVEILLE_HTTP_ALLOWED_HOSTS   host, host:port or host:* the built-in http handler may call (comma list;
                                a bare host means ports 80 and 443; IPv6 as [::1]:*; empty = none)
  REVEILLE_HTTP_ALLOWED_NETS    CIDRs of loopback/private/link-local addresses it may connect to (comma list)
  REVEILLE_APPROVAL_TTL         how long a spending approval request stays pending (default 24h)
  REVEILLE_TOOL_APPROVAL_TTL    how long a tool call waits for a human before it is denied as expired (default 1h)
  REVEILLE_SIGNAL_NOTFOUND_GRACE how long a signal to an absent workflow is retried (default 60s)
  REVEILLE_STREAM_MAX_CHUNK     largest stream chunk in bytes (default 1048576)
  REVEILLE_STREAM_MAX_REQUEST   largest stream append request in bytes (default 8388608)
  REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST most chunks in one JSON stream append (default 1000)
  REVEILLE_STREAM_RETENTION     how long closed streams are kept (default 168h)
  REVEILLE_SHUTDOWN_GRACE       on SIGTERM/Ctrl-C, how long running work may finish before it is handed back (default 30s)
  REVEILLE_IDEMPOTENCY_RETENTION how long an Idempotency-Key's first response is replayed (default 24h)
  REVEILLE_SPEND_KEY_RETENTION  how long a mandate spend's idempotency key is kept (default 24h; at least the above)
  REVEILLE_MANDATE_APPROVAL_RETENTION how long a resolved spending approval request is kept (default 168h)
  REVEILLE_WAKEUP_RETENTION     how long a resolved wake-up whose signal is settled is kept (default 168h; at least the idempotency retention)
  REVEILLE_TOOL_APPROVAL_RETENTION how long a decided tool call is kept (default 168h; at least the idempotency retention)
  REVEILLE_QUEUE_RETENTION      how long a delivered or undeliverable signal is kept (default 168h; as long as its wake-up or tool call at least)
  REVEILLE_SESSION_EVENT_RETENTION how long a session event is kept, once the session has no call pending (default 168h)
  REVEILLE_APPROVAL_EVENT_RETENTION how long an approvals inbox event is kept for readers resuming the stream (default 168h)
  REVEILLE_RETENTION_INTERVAL   how often the leader purges rows past their retention (default 10m)
  REVEILLE_WORKER               run the reference workflow's Temporal worker (default false; dev: true)
  REVEILLE_LOG_LEVEL            debug, info, warn or error (default info)
  REVEILLE_WEBHOOK_POOL         pool approval webhooks are delivered on, one of REVEILLE_POOLS but wakeup (default "default",
                                else the first of REVEILLE_POOLS by name but wakeup)
  REVEILLE_PUBLIC_URL           the engine's address as people reach it; Slack webhook messages link to its /inbox

Durations (such as 30s or 24h) are at least 1s, except where a line above says otherwise.
`

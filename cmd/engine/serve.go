package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"
	"golang.org/x/sync/errgroup"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/migrations"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
	"github.com/reveille/reveille/workpool"
)

func runServe(ctx context.Context, args []string) error {
	s, err := envConfig()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s.bindFlags(fs, false)
	fs.Usage = func() { flagUsage(fs, "engine serve [flags]", serveEnvHelp) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set (serve uses external Postgres; `engine dev` starts a local one)")
	}
	if s.TemporalAddr == "" {
		s.TemporalAddr = "127.0.0.1:7233"
	}
	if err := s.authConfig().Validate(); err != nil {
		return err
	}
	return serve(ctx, s, newLogger(s.LogLevel), nil)
}

// serve runs the service until ctx ends: migrate, build the domain services,
// start their background loops, serve HTTP, then stop in reverse order.
// ready, if set, is called once the API listens.
func serve(ctx context.Context, s settings, logger *slog.Logger, ready func()) error {
	a, err := newApp(ctx, s, logger)
	if err != nil {
		return err
	}
	defer a.close()
	return a.run(ctx, ready)
}

// app holds the wired service.
type app struct {
	s        settings
	logger   *slog.Logger
	db       *pgxpool.Pool
	temporal client.Client
	registry *prometheus.Registry
	api      *api.Server
	// starters run background loops until their context ends.
	starters []func(ctx context.Context) error
}

func newApp(ctx context.Context, s settings, logger *slog.Logger) (*app, error) {
	a := &app{s: s, logger: logger, registry: prometheus.NewRegistry()}
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	cfg, err := pgxpool.ParseConfig(s.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if cfg.MaxConns < 20 {
		cfg.MaxConns = 20
	}
	if a.db, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	if err := waitForPostgres(ctx, a.db); err != nil {
		a.close()
		return nil, err
	}
	n, err := migrations.UpPool(ctx, a.db, nil)
	if err != nil {
		a.close()
		return nil, err
	}
	logger.Info("database migrated", "applied", n)

	// One Temporal client per process; lazy, so the service starts (and
	// queues signals) while Temporal is down.
	a.temporal, err = client.NewLazyClient(client.Options{
		HostPort: s.TemporalAddr, Namespace: s.Namespace, Logger: temporalLogger{logger},
	})
	if err != nil {
		a.close()
		return nil, fmt.Errorf("temporal client for %s: %w", s.TemporalAddr, err)
	}

	svc := api.Services{DB: a.db, Ready: []api.ReadinessCheck{{Name: "temporal", Check: func(ctx context.Context) error {
		_, err := a.temporal.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}}}}
	if err := a.wireDomain(ctx, &svc); err != nil {
		a.close()
		return nil, err
	}
	a.api, err = api.New(ctx, api.Config{
		Addr: s.Addr, MaxBody: s.MaxBody, Logger: logger, Registry: a.registry,
		ReadHeaderTimeout: s.HeaderTimeout, ReadTimeout: s.ReadTimeout, IdleTimeout: s.IdleTimeout, OrgRate: s.OrgRate,
		Auth: s.authConfig(),
	}, svc)
	if err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// wireDomain builds the domain services and their background loops.
func (a *app) wireDomain(_ context.Context, svc *api.Services) error {
	s, reg, logger := a.s, a.registry, a.logger
	poolCfg := s.workpoolConfig()
	poolCfg.Logger, poolCfg.Registry = logger, reg
	pool, err := workpool.New(a.db, poolCfg)
	if err != nil {
		return fmt.Errorf("workpool: %w", err)
	}
	if err := registerHandlers(pool, s, reg); err != nil {
		return err
	}
	svc.Workpool = pool
	svc.Mandates = mandates.New(a.db, mandates.Config{ApprovalTTL: s.ApprovalTTL, Logger: logger, Registry: reg})
	streamsCfg := s.streamsConfig()
	streamsCfg.Logger, streamsCfg.Registry = logger, reg
	svc.Streams, err = streams.New(a.db, streamsCfg)
	if err != nil {
		return fmt.Errorf("streams: %w", err)
	}
	svc.Wakeups = wakeup.New(a.db, pool, svc.Mandates, wakeup.Config{Logger: logger, Registry: reg})
	svc.Approvals = approvals.New(a.db, approvals.Config{TTL: s.ToolTTL, Logger: logger, Registry: reg})
	dispatcher := queue.NewDispatcher(a.db, a.temporal, queue.DispatcherConfig{NotFoundGrace: s.NotFoundGrace, Logger: logger, Registry: reg})

	a.starters = append(a.starters,
		lifecycle("workpool", pool, logger),
		lifecycle("mandates", svc.Mandates, logger),
		lifecycle("streams", svc.Streams, logger),
		lifecycle("wakeup", svc.Wakeups, logger),
		lifecycle("approvals", svc.Approvals, logger),
		lifecycle("signal dispatcher", dispatcher, logger),
	)
	if s.Worker {
		w := reference.NewWorker(a.temporal, workflows.TaskQueue, svc.Wakeups, svc.Approvals)
		a.starters = append(a.starters, func(ctx context.Context) error {
			// The worker keeps retrying while Temporal is down; Start fails
			// only on a registration error.
			if err := w.Start(); err != nil {
				return fmt.Errorf("temporal worker: %w", err)
			}
			<-ctx.Done()
			w.Stop()
			return nil
		})
	}
	return nil
}

// component is the Start/Stop lifecycle every background part shares.
type component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// lifecycle runs c until ctx ends, then stops it (draining for up to 30 s).
func lifecycle(name string, c component, logger *slog.Logger) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := c.Start(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			logger.Warn("stopping "+name+" failed", "error", err.Error())
		}
		return nil
	}
}

func (a *app) run(ctx context.Context, ready func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	for _, start := range a.starters {
		g.Go(func() error { return start(gctx) })
	}
	ln, err := listen(a.s.Addr)
	if err != nil {
		cancel()
		_ = g.Wait()
		return err
	}
	a.logger.Info("reveille serving", "addr", ln.Addr().String(), "version", version)
	if ready != nil {
		ready()
	}
	g.Go(func() error { return a.api.Serve(gctx, ln) })
	err = g.Wait()
	a.logger.Info("reveille stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (a *app) close() {
	if a.temporal != nil {
		a.temporal.Close()
	}
	if a.db != nil {
		a.db.Close()
	}
}

func waitForPostgres(ctx context.Context, db *pgxpool.Pool) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := db.Ping(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres does not answer: %w", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

func flagUsage(fs *flag.FlagSet, synopsis, env string) {
	fmt.Fprintf(fs.Output(), "Usage: %s\n\nFlags:\n", synopsis)
	fs.PrintDefaults()
	if env != "" {
		fmt.Fprintf(fs.Output(), "\nEnvironment:\n%s", env)
	}
}

const serveEnvHelp = `  DATABASE_URL                  Postgres connection string (required for serve)
  TEMPORAL_ADDRESS              Temporal frontend host:port (serve default 127.0.0.1:7233)
  TEMPORAL_NAMESPACE            Temporal namespace for signals (default "default")
  REVEILLE_JWT_SECRET           HS256 secrets, each at least 32 bytes (comma list: the first signs, all verify)
  REVEILLE_JWKS_URL             JWKS URL for RS256/ES256/EdDSA tokens (instead of the secret)
  REVEILLE_JWT_ISSUER           required iss (required with REVEILLE_JWKS_URL; else checked when set)
  REVEILLE_JWT_AUDIENCE         required aud (required with REVEILLE_JWKS_URL; else checked when set)
  REVEILLE_OPERATOR_ORGS        orgs whose operator role counts (comma list)
  REVEILLE_MAX_BODY             request body limit in bytes (default 1048576)
  REVEILLE_READ_HEADER_TIMEOUT  time a client has to send a request's headers (default 10s)
  REVEILLE_READ_TIMEOUT         time a client has to send a whole request, body included (default 60s)
  REVEILLE_IDLE_TIMEOUT         how long an idle kept-alive connection stays open (default 120s)
  REVEILLE_ORG_RATE             requests per second per org on this replica, bursts of twice that (default 10000; 0 = no limit)
  REVEILLE_POOLS                pools created at start if missing (default default=25,wakeup=25)
  REVEILLE_RECOVERY_PERIOD      how often running work is checked for dead executors (default 10s)
  REVEILLE_HEARTBEAT_TIMEOUT    heartbeat age after which running work is recovered (default 30s)
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
  REVEILLE_WORKER               run the reference workflow's Temporal worker (default false; dev: true)
  REVEILLE_LOG_LEVEL            debug, info, warn or error (default info)
`

// temporalLogger routes the SDK's logs into slog.
type temporalLogger struct{ l *slog.Logger }

func (t temporalLogger) Debug(msg string, kv ...any) { t.l.Debug(msg, kv...) }
func (t temporalLogger) Info(msg string, kv ...any)  { t.l.Debug(msg, kv...) }
func (t temporalLogger) Warn(msg string, kv ...any)  { t.l.Warn(msg, kv...) }
func (t temporalLogger) Error(msg string, kv ...any) {
	// The SDK logs every failed poll while Temporal is down, and a refused
	// spend is an expected activity outcome: neither is an error here.
	if strings.Contains(msg, "poll") {
		t.l.Warn(msg, kv...)
		return
	}
	if strings.Contains(fmt.Sprint(kv...), reference.RefusedErrorType) {
		t.l.Info(msg, kv...)
		return
	}
	t.l.Error(msg, kv...)
}

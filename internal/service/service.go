// Package service builds the running service from typed settings: the
// database pool (migrated), the one Temporal client, the domain services
// and the hooks between them, the signal dispatcher, the optional Temporal
// worker and the API. `engine serve` and `engine dev` run it; the demo and
// the benchmarks build theirs through it too, so there is one wiring.
//
// It reads no environment and parses no flags: cmd/engine does that, once,
// and hands New a Config.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/gauges"
	"github.com/reveille/reveille/internal/retention"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/migrations"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/webhooks"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// Config is everything the service is built from. Each package's part is
// that package's own Config; their Logger and Registry fields are ignored:
// the service gives every part its logger and its one registry.
type Config struct {
	// DatabaseURL is the Postgres connection string. Required.
	DatabaseURL string
	// ConfigureDB adjusts the database pool's settings after the service's
	// own (at least 20 connections) and before it connects: the
	// benchmarks size the pool and add tracers.
	ConfigureDB func(*pgxpool.Config)
	// TemporalAddress is the Temporal frontend (default 127.0.0.1:7233).
	TemporalAddress string
	// Namespace is the Temporal namespace signals go to (default "default").
	Namespace string

	// API is the HTTP server: its address, limits and token verification.
	API       api.Config
	Workpool  workpool.Config
	HTTPWork  httpwork.Config
	Mandates  mandates.Config
	Streams   streams.Config
	Wakeup    wakeup.Config
	Approvals approvals.Config
	// Inbox configures the approvals event log (its events' retention is
	// Retention.ApprovalEvents).
	Inbox inbox.Config
	// Webhooks configures the approval webhooks (their CheckURL is the
	// HTTPWork allow-list's, set here).
	Webhooks webhooks.Config
	// Retention purges old rows (internal/retention). Its
	// IdempotencyRecords is ignored: the purge keeps the API's records for
	// API.IdempotencyRetention, the window the API replays them in.
	Retention retention.Config
	// Dispatcher sends the queued signals through the Temporal client.
	Dispatcher queue.DispatcherConfig
	// WrapSignaler, when set, wraps the Temporal client as the dispatcher
	// sees it (the wake benchmark notes when each signal is sent).
	WrapSignaler func(queue.Signaler) queue.Signaler
	// Worker, when set, runs the reference workflow's Temporal worker.
	Worker *WorkerConfig
	// GaugePeriod is how often the promise's gauges (outbox, open
	// wake-ups, pending approvals) are read (default 15 s).
	GaugePeriod time.Duration

	// StopTimeout bounds each part's Stop once Run's context ends
	// (default 30 s; with ShutdownGrace, long enough for it).
	StopTimeout time.Duration
	// ShutdownGrace, when set, is how long running work may finish once
	// Run's context ends before it is canceled and handed back to another
	// replica (REVEILLE_SHUTDOWN_GRACE; engine commands default it to
	// DefaultShutdownGrace). It overrides Workpool.StopGrace.
	ShutdownGrace time.Duration
	// Version is logged when the API listens.
	Version string
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// WorkerConfig configures the Temporal worker of the reference workflow.
type WorkerConfig struct {
	// TaskQueue it polls (default workflows.TaskQueue).
	TaskQueue string
	// Register, when set, adds the caller's own workflows and activities
	// to the worker before it starts (the wake benchmark's parked workflow).
	Register func(worker.Registry)
}

// DefaultTemporalAddress is where serve finds Temporal when not told.
const DefaultTemporalAddress = "127.0.0.1:7233"

// DefaultShutdownGrace is REVEILLE_SHUTDOWN_GRACE's default.
const DefaultShutdownGrace = 30 * time.Second

// handBackTime is what a stop needs beyond the grace: canceling the
// handlers that did not finish, recording their hand-backs.
const handBackTime = 10 * time.Second

// minDBConns is the least size of the database pool: the pool's loops,
// the dispatcher, the hubs' listeners and the API share it.
const minDBConns = 20

func (c Config) withDefaults() Config {
	c.TemporalAddress = cmp.Or(c.TemporalAddress, DefaultTemporalAddress)
	c.Namespace = cmp.Or(c.Namespace, "default")
	c.StopTimeout = cmp.Or(c.StopTimeout, 30*time.Second)
	if c.ShutdownGrace > 0 {
		c.Workpool.StopGrace = c.ShutdownGrace
		// The pool gives its handlers at most three quarters of its Stop's
		// time (workpool.Manager.Stop): leave it the whole grace, and the
		// hand-backs their time after it.
		c.StopTimeout = max(c.StopTimeout, c.ShutdownGrace*4/3+handBackTime)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Worker != nil {
		w := *c.Worker
		w.TaskQueue = cmp.Or(w.TaskQueue, workflows.TaskQueue)
		c.Worker = &w
	}
	return c
}

// Service is the wired service. Build it with New, run it with Run, and
// release it with Close.
type Service struct {
	cfg      Config
	logger   *slog.Logger
	db       *pgxpool.Pool
	temporal client.Client
	registry *prometheus.Registry

	workpool   *workpool.Manager
	mandates   *mandates.Service
	streams    *streams.Service
	wakeups    *wakeup.Service
	approvals  *approvals.Service
	inbox      *inbox.Log
	webhooks   *webhooks.Store
	dispatcher *queue.Dispatcher
	retention  *retention.Purger
	api        *api.Server
	// parts are the background loops, in start order.
	parts []part
}

// part is a background loop with the Start/Stop lifecycle every one shares.
type part struct {
	name     string
	stopLast bool // stopped after every other part (the signal dispatcher)
	c        interface {
		Start(ctx context.Context) error
		Stop(ctx context.Context) error
	}
}

// New makes the Temporal client and checks its namespace (a Temporal that
// answers it has none fails New; one that does not answer does not),
// connects to Postgres (waiting up to 30 s for it to answer), applies the
// migrations and builds every part. Nothing
// runs yet: register extra work handlers, then Run. On error everything
// New opened is closed again.
func New(ctx context.Context, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if cfg.DatabaseURL == "" {
		return nil, errors.New("service: no database URL")
	}
	s := &Service{cfg: cfg, logger: cfg.Logger, registry: prometheus.NewRegistry()}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.build(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Service) build(ctx context.Context) error {
	// A malformed DATABASE_URL stops the start before anything is dialled.
	if _, err := pgxpool.ParseConfig(s.cfg.DatabaseURL); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	// One Temporal client per process; lazy, so the service starts (and
	// queues signals) while Temporal is down.
	var err error
	s.temporal, err = client.NewLazyClient(client.Options{
		HostPort: s.cfg.TemporalAddress, Namespace: s.cfg.Namespace, Logger: TemporalLogger(s.logger),
	})
	if err != nil {
		return fmt.Errorf("temporal client for %s: %w", s.cfg.TemporalAddress, err)
	}
	// Before the database is touched: a namespace Temporal says it does
	// not have fails every signal, forever.
	if err := s.checkNamespaceAtStart(ctx); err != nil {
		return err
	}

	if err := s.connect(ctx); err != nil {
		return err
	}
	n, err := migrations.UpPool(ctx, s.db, s.logger)
	if err != nil {
		return err
	}
	s.logger.Info("database migrated", "applied", n)
	if err := s.warnUnknownMigrations(ctx); err != nil {
		return err
	}
	if err := s.buildDomain(); err != nil {
		return err
	}
	if err := s.checkWakeupPool(ctx); err != nil {
		return err
	}
	return s.buildAPI(ctx)
}

// namespaceCheckTimeout bounds the namespace check at start: a Temporal
// that refuses connections fails it at once, one that does not answer
// holds the start up this long.
const namespaceCheckTimeout = 5 * time.Second

// checkNamespaceAtStart fails the start when Temporal answers that the
// namespace does not exist. A Temporal that does not answer does not stop
// the start (signals wait in the outbox until it does, and /readyz then
// reports the namespace if it is missing).
func (s *Service) checkNamespaceAtStart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, namespaceCheckTimeout)
	defer cancel()
	err := s.describeNamespace(ctx)
	var missing namespaceNotFound
	switch {
	case errors.As(err, &missing):
		return err
	case err != nil:
		s.logger.Warn("temporal does not answer at start: signals wait in the outbox until it does",
			"address", s.cfg.TemporalAddress, "namespace", s.cfg.Namespace, "error", err.Error())
	}
	return nil
}

// describeNamespace asks Temporal for the service's namespace: a
// namespaceNotFound when Temporal says there is none, Temporal's error
// when it does not answer.
func (s *Service) describeNamespace(ctx context.Context) error {
	_, err := s.temporal.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.cfg.Namespace})
	// A NotFound without the namespace detail (a proxy's) can only be the
	// namespace's too.
	var nf *serviceerror.NamespaceNotFound
	var notFound *serviceerror.NotFound
	if errors.As(err, &nf) || errors.As(err, &notFound) {
		return namespaceNotFound{namespace: s.cfg.Namespace, address: s.cfg.TemporalAddress}
	}
	return err
}

// namespaceNotFound is Temporal's answer that the namespace signals go
// to does not exist: every signal would fail.
type namespaceNotFound struct{ namespace, address string }

func (e namespaceNotFound) Error() string {
	return fmt.Sprintf("TEMPORAL_NAMESPACE=%q: Temporal at %s has no such namespace (every signal would fail): register it or name an existing one", e.namespace, e.address)
}

// temporalReady is /readyz's and reveille_dependency_up's check of
// Temporal: its frontend answers, and has the namespace. Only Temporal's
// answer that the namespace is missing fails the second part — one that
// may not describe it (authorization) still sends signals.
func (s *Service) temporalReady(ctx context.Context) error {
	if _, err := s.temporal.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return err
	}
	var missing namespaceNotFound
	if err := s.describeNamespace(ctx); errors.As(err, &missing) {
		return err
	}
	return nil
}

// warnUnknownMigrations logs one warning when the schema has migrations
// this binary does not know: an older binary on a newer schema, as after
// a rollback. It runs — refusing would turn a rollback into an outage —
// but the operator should know it was not tested on that schema.
func (s *Service) warnUnknownMigrations(ctx context.Context) error {
	unknown, err := migrations.UnknownPool(ctx, s.db)
	if err != nil {
		return err
	}
	if len(unknown) == 0 {
		return nil
	}
	versions := make([]int64, len(unknown))
	for i, u := range unknown {
		versions[i] = u.Version
	}
	s.logger.Warn("the database has migrations this binary does not know (a newer binary's, as after a rollback): running on a schema it was not built for",
		"unknown_versions", versions, "version", s.cfg.Version)
	return nil
}

// connect opens the database pool and waits for Postgres to answer.
func (s *Service) connect(ctx context.Context) error {
	pc, err := pgxpool.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = max(pc.MaxConns, minDBConns)
	// No JIT (unless the URL asks for it): Postgres compiles a statement
	// whose estimated cost passes jit_above_cost at every execution, and
	// the pool loop's fair start, estimated from the orgs queued, passes
	// it from a couple of thousand orgs with work on: 483 functions, ~4 s
	// of compiling for a start that runs in ~30 ms.
	if _, set := pc.ConnConfig.RuntimeParams["jit"]; !set {
		pc.ConnConfig.RuntimeParams["jit"] = "off"
	}
	// A connection whose peer stopped answering at the TCP level ends
	// within about 35 s on both sides (parameters in the URL win).
	db.BoundNetwork(pc.ConnConfig)
	if s.cfg.ConfigureDB != nil {
		s.cfg.ConfigureDB(pc)
	}
	if s.db, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	return waitForPostgres(ctx, s.db)
}

// checkWakeupPool refuses the start when the database has no pool for the
// wake-ups that name none (wakeup.DefaultPool): no route creates a pool —
// REVEILLE_POOLS does, on some replica — and without it every such
// wake-up would be refused, naming a pool field the client never sent.
func (s *Service) checkWakeupPool(ctx context.Context) error {
	_, err := s.workpool.Pool(ctx, "", wakeup.DefaultPool)
	if errors.Is(err, workpool.ErrPoolNotFound) {
		return fmt.Errorf("REVEILLE_POOLS: the database has no pool %q, where wake-ups' work runs unless they name another: add %s=N (the default is %s)",
			wakeup.DefaultPool, wakeup.DefaultPool, workpool.DefaultPools)
	}
	if err != nil {
		return fmt.Errorf("checking the wake-ups' pool: %w", err)
	}
	return nil
}

// buildDomain builds the domain services, the hooks between them and the
// dispatcher, in the order of their dependencies.
func (s *Service) buildDomain() error {
	c, logger, reg := s.cfg, s.logger, s.registry
	var err error

	poolCfg := c.Workpool
	poolCfg.Logger, poolCfg.Registry = logger, reg
	if s.workpool, err = workpool.New(s.db, poolCfg); err != nil {
		return fmt.Errorf("workpool: %w", err)
	}
	httpCfg := c.HTTPWork
	httpCfg.Registry = reg
	if err := httpwork.Register(s.workpool, httpCfg); err != nil {
		return err
	}
	if len(httpCfg.AllowedHosts) == 0 {
		// (a replica started without it beside replicas that have it runs
		// its share of their http work and webhook deliveries, and fails
		// each for good: the refusal is final)
		logger.Warn("REVEILLE_HTTP_ALLOWED_HOSTS is empty: this replica refuses every http work item and approval webhook delivery its executor runs, and they fail for good; set it (and REVEILLE_HTTP_ALLOWED_NETS) as on the other replicas")
	}
	// Webhook URLs are checked against the http handler's own allow-list
	// when they are registered; deliveries go through the handler.
	urlRules, err := httpwork.NewURLRules(httpCfg)
	if err != nil {
		return err
	}
	webhooksCfg := c.Webhooks
	webhooksCfg.CheckURL = urlRules.CheckURL
	s.webhooks = webhooks.New(s.db, s.workpool, webhooksCfg)

	inboxCfg := c.Inbox
	inboxCfg.Logger = logger
	s.inbox = inbox.New(s.db, inboxCfg)
	// Each event's webhook deliveries are enqueued in the event's own
	// transaction: they commit together or not at all.
	s.inbox.OnAppend = func(ctx context.Context, q db.Querier, ev inbox.Event) error {
		return s.webhooks.Enqueue(ctx, q, webhooks.Event(ev))
	}

	mandatesCfg := c.Mandates
	mandatesCfg.Logger, mandatesCfg.Registry = logger, reg
	mandatesCfg.Inbox = s.inbox
	s.mandates = mandates.New(s.db, mandatesCfg)

	streamsCfg := c.Streams
	streamsCfg.Logger, streamsCfg.Registry = logger, reg
	if s.streams, err = streams.New(s.db, streamsCfg); err != nil {
		return fmt.Errorf("streams: %w", err)
	}

	var signals queue.Signaler = s.temporal
	if c.WrapSignaler != nil {
		signals = c.WrapSignaler(signals)
	}
	dispatcherCfg := c.Dispatcher
	dispatcherCfg.Logger, dispatcherCfg.Registry = logger, reg
	if dispatcherCfg.History == nil {
		// The wrapper wraps the sends; closed workflows are read from Temporal.
		dispatcherCfg.History = s.temporal
	}
	s.dispatcher = queue.NewDispatcher(s.db, signals, dispatcherCfg)

	wakeupCfg := c.Wakeup
	wakeupCfg.Logger, wakeupCfg.Registry = logger, reg
	// Wake signals of work completed here go to this replica's dispatcher.
	wakeupCfg.Dispatcher = s.dispatcher
	s.wakeups = wakeup.New(s.db, s.workpool, s.mandates, wakeupCfg)

	approvalsCfg := c.Approvals
	approvalsCfg.Logger, approvalsCfg.Registry = logger, reg
	approvalsCfg.Inbox = s.inbox
	s.approvals = approvals.New(s.db, approvalsCfg)

	retentionCfg := c.Retention
	retentionCfg.Logger, retentionCfg.Registry = logger, reg
	retentionCfg.IdempotencyRecords = cmp.Or(c.API.IdempotencyRetention, api.DefaultIdempotencyRetention)
	if s.retention, err = retention.New(s.db, retentionCfg); err != nil {
		return err
	}

	s.parts = []part{
		{name: "approvals inbox", c: s.inbox},
		{name: "workpool", c: s.workpool},
		{name: "mandates", c: s.mandates},
		{name: "streams", c: s.streams},
		{name: "wakeup", c: s.wakeups},
		{name: "approvals", c: s.approvals},
		{name: "retention", c: s.retention},
		{name: "signal dispatcher", c: s.dispatcher, stopLast: true},
		// On every replica: see package gauges for why not the leader only.
		{name: "gauges", c: gauges.New(s.db, gauges.Config{Period: c.GaugePeriod, Logger: logger, Registry: reg})},
	}
	if c.Worker != nil {
		w := reference.NewWorker(s.temporal, c.Worker.TaskQueue, s.wakeups, s.approvals)
		if c.Worker.Register != nil {
			c.Worker.Register(w)
		}
		s.parts = append(s.parts, part{name: "temporal worker", c: temporalWorker{w}})
	}
	return nil
}

func (s *Service) buildAPI(ctx context.Context) error {
	apiCfg := s.cfg.API
	apiCfg.Logger, apiCfg.Registry = s.logger, s.registry
	temporalReady := api.ReadinessCheck{Name: "temporal", Check: s.temporalReady}
	var err error
	s.api, err = api.New(ctx, apiCfg, api.Services{
		DB: s.db, Ready: []api.ReadinessCheck{temporalReady},
		Workpool: s.workpool, Mandates: s.mandates, Streams: s.streams, Wakeups: s.wakeups, Approvals: s.approvals,
		Inbox:    s.inbox,
		Webhooks: s.webhooks,
	})
	return err
}

// Run starts the background loops in order, serves the API until ctx
// ends, then stops everything. ready, if set, is called with the API's
// address once it listens. Run returns nil when ctx ends; a loop that
// fails to start or an API that cannot listen ends it with an error,
// after stopping what had started.
func (s *Service) Run(ctx context.Context, ready func(addr net.Addr)) error {
	started, err := s.start(ctx)
	if err != nil {
		s.stop(started)
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.API.Addr)
	if err != nil {
		s.stop(started)
		return fmt.Errorf("listen on %s: %w", s.cfg.API.Addr, err)
	}
	var opsLn net.Listener
	if s.cfg.API.OpsAddr != "" {
		if opsLn, err = net.Listen("tcp", s.cfg.API.OpsAddr); err != nil {
			ln.Close()
			s.stop(started)
			return fmt.Errorf("listen on %s (REVEILLE_OPS_ADDR): %w", s.cfg.API.OpsAddr, err)
		}
		s.logger.Info("reveille serving /healthz, /readyz and /metrics", "ops_addr", opsLn.Addr().String())
	}
	s.logger.Info("reveille serving", "addr", ln.Addr().String(), "version", s.cfg.Version)
	if ready != nil {
		ready(ln.Addr())
	}
	// The API drains while the loops stop, not before them: an SSE tail
	// ends when the streams hub stops, and would otherwise hold the drain
	// for its whole timeout.
	served := make(chan error, 1)
	go func() { served <- s.api.Serve(ctx, ln) }()
	opsServed := make(chan error, 1)
	if opsLn != nil {
		go func() { opsServed <- s.api.ServeOps(ctx, opsLn) }()
	} else {
		opsServed <- nil
	}
	select {
	case err = <-served: // the API failed on its own
		s.stop(started)
	case <-ctx.Done():
		s.stop(started)
		err = <-served
	}
	// (A failed ops listener leaves the API serving: probes fail, which
	// says so. It ends with ctx.)
	if opsErr := <-opsServed; opsErr != nil && !errors.Is(opsErr, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("ops listener: %w", opsErr))
	}
	s.logger.Info("reveille stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// start starts the parts in order and returns those that started.
func (s *Service) start(ctx context.Context) ([]part, error) {
	for i, p := range s.parts {
		if err := p.c.Start(context.WithoutCancel(ctx)); err != nil {
			return s.parts[:i], fmt.Errorf("start %s: %w", p.name, err)
		}
	}
	return s.parts, nil
}

// stop stops the parts in two waves, each part within StopTimeout: first
// every part but the signal dispatcher, at once (the pool lets its running
// handlers finish within its own grace and hands the rest back), then the
// dispatcher — which therefore still sends the wake signals of the work
// that finished during the pool's drain, handed to it by the completer.
func (s *Service) stop(parts []part) {
	var first, last []part
	for _, p := range parts {
		if p.stopLast {
			last = append(last, p)
		} else {
			first = append(first, p)
		}
	}
	for _, wave := range [][]part{first, last} {
		var wg sync.WaitGroup
		for _, p := range wave {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout)
				defer cancel()
				if err := p.c.Stop(ctx); err != nil {
					s.logger.Warn("stopping "+p.name+" failed", "error", err.Error())
				}
			})
		}
		wg.Wait()
	}
}

// Close releases the Temporal client and the database pool. Call it after
// Run has returned (or instead of Run).
func (s *Service) Close() {
	if s.temporal != nil {
		s.temporal.Close()
	}
	if s.db != nil {
		s.db.Close()
	}
}

// DB is the service's database pool.
func (s *Service) DB() *pgxpool.Pool { return s.db }

// Temporal is the service's one Temporal client.
func (s *Service) Temporal() client.Client { return s.temporal }

// Workpool is the work pool manager: register handlers on it before Run.
func (s *Service) Workpool() *workpool.Manager { return s.workpool }

// Mandates is the spending-authority service.
func (s *Service) Mandates() *mandates.Service { return s.mandates }

// Streams is the run-streams service.
func (s *Service) Streams() *streams.Service { return s.streams }

// Wakeups is the wake-up service.
func (s *Service) Wakeups() *wakeup.Service { return s.wakeups }

// Inbox is the approvals event log.
func (s *Service) Inbox() *inbox.Log { return s.inbox }

// Approvals is the tool-approvals service.
func (s *Service) Approvals() *approvals.Service { return s.approvals }

// Webhooks is the approval webhooks' store: its Enqueue delivers an
// approvals event to the org's webhooks in the event's transaction.
func (s *Service) Webhooks() *webhooks.Store { return s.webhooks }

// temporalWorker gives a Temporal worker the parts' Start/Stop.
type temporalWorker struct{ w worker.Worker }

// Start fails only on a registration error: the worker keeps retrying
// while Temporal is down.
func (t temporalWorker) Start(context.Context) error { return t.w.Start() }

func (t temporalWorker) Stop(context.Context) error {
	t.w.Stop()
	return nil
}

// waitForPostgres pings db until it answers, for at most 30 s; what it
// returns names the last ping's own error, not the stop that ended the wait.
func waitForPostgres(ctx context.Context, db *pgxpool.Pool) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		err := db.Ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			// (a ping the stop cut off says only that: keep the one before)
			return fmt.Errorf("postgres did not answer before the stop: %w (%w)", cmp.Or(last, err), ctx.Err())
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres does not answer: %w", last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Package api is Reveille's HTTP layer: an echo server with JWT auth,
// per-route roles, Idempotency-Key replay, RFC 9457 problem+json errors,
// metrics and the OpenAPI document. It is thin: handlers decode, check roles
// and tenancy, call a domain package and encode; domain packages know
// nothing of HTTP.
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/singleflight"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/web"
	"github.com/reveille/reveille/webhooks"
	"github.com/reveille/reveille/workpool"
)

// Config configures the server. Zero values take the defaults noted.
type Config struct {
	// Addr to listen on (default ":8080").
	Addr string
	// OpsAddr, when set, is the address of a second listener that serves
	// /healthz, /readyz and /metrics alone (REVEILLE_OPS_ADDR; ServeOps):
	// probes and scrapes never wait behind clients' connections there, and
	// /metrics — totals across orgs — leaves the API listener for a network
	// only the operator reaches. Probes stay on the API listener too. Its
	// requests are counted in the HTTP metrics and access-logged as the
	// API listener's are.
	OpsAddr string
	// MaxBody is the request body limit in bytes (default 1 MiB).
	MaxBody int64
	// Auth says how tokens are verified.
	Auth AuthConfig
	// Logger for access and error logs (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the HTTP metrics and serves /metrics (default: a new
	// registry with the Go and process collectors).
	Registry *prometheus.Registry
	// ShutdownTimeout bounds the graceful drain on stop (default 15 s).
	ShutdownTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (default 10 s), so
	// a client that sends them a byte at a time is disconnected.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (default
	// 60 s). It does not bound an SSE response: net/http lifts the read
	// deadline once the request is read.
	ReadTimeout time.Duration
	// WriteTimeout bounds handling a request and writing its response
	// (default 60 s), so a client that stops reading a large answer does
	// not hold it and its connection for good. An SSE response has no
	// overall bound: each of its writes (events and keep-alives) gets
	// WriteTimeout of its own.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a kept-alive connection waits for its
	// next request (default 120 s).
	IdleTimeout time.Duration
	// OrgRate is each org's request rate limit on /v1 routes, in requests
	// per second on this replica (default 0: no limit; `engine serve` sets
	// REVEILLE_ORG_RATE, default 10,000). Over it is 429 with Retry-After.
	OrgRate float64
	// OrgBurst is the bucket size of OrgRate (default twice OrgRate).
	OrgBurst int
	// OrgMaxStreams bounds the live streams (SSE) each org holds open on
	// this replica (REVEILLE_ORG_MAX_STREAMS; default DefaultOrgMaxStreams;
	// negative: no cap). Over it a new stream is 429.
	OrgMaxStreams int
	// MaxConnections bounds the connections this server holds open
	// (REVEILLE_MAX_CONNECTIONS; default half the process's open-file limit,
	// so that its database, Temporal and outbound connections always find a
	// file descriptor; negative: no bound). At it a new connection closes
	// the one idle the longest between requests, or waits while all are
	// busy. Live streams, which never turn idle, may hold three quarters
	// of it together; past that a new one is 503 too-many-streams.
	MaxConnections int
	// InboxKeepAlive is how often an idle approvals event stream gets a
	// keep-alive comment (default 15 s).
	InboxKeepAlive time.Duration
	// IdempotencyRetention is how long the first response to an
	// Idempotency-Key is replayed (REVEILLE_IDEMPOTENCY_RETENTION; default
	// DefaultIdempotencyRetention). internal/retention purges the records
	// after it.
	IdempotencyRetention time.Duration
}

// Defaults of Config's HTTP server timeouts.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 1 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 15 * time.Second
	}
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.InboxKeepAlive = cmp.Or(c.InboxKeepAlive, DefaultInboxKeepAlive)
	c.OrgMaxStreams = cmp.Or(c.OrgMaxStreams, DefaultOrgMaxStreams)
	c.MaxConnections = cmp.Or(c.MaxConnections, defaultMaxConnections())
	c.IdempotencyRetention = cmp.Or(c.IdempotencyRetention, DefaultIdempotencyRetention)
	return c
}

// ReadinessCheck is one dependency /readyz asks.
type ReadinessCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// Services are the domain services the routes call. A nil service leaves
// its routes out (and out of the OpenAPI test's comparison).
type Services struct {
	// DB is required: idempotency records and readiness.
	DB *pgxpool.Pool
	// Ready lists extra readiness checks (Temporal).
	Ready []ReadinessCheck
	// Streams serves the run stream routes (SPEC §8).
	Streams *streams.Service
	// Mandates serves mandates, spend and overrun approvals (SPEC §6).
	Mandates *mandates.Service
	// Wakeups serves the wake-up routes (SPEC §5).
	Wakeups *wakeup.Service
	// Workpool serves plain work and the pool routes (SPEC §3).
	Workpool *workpool.Manager
	// Approvals serves sessions, tool calls and tool policies (SPEC §7).
	Approvals *approvals.Service
	// Inbox serves the approvals event stream and the lists' events_seq
	// (issue 14).
	Inbox *inbox.Log
	// Webhooks serves the approval webhooks (issue 14).
	Webhooks *webhooks.Store
}

// Server is the HTTP API.
type Server struct {
	cfg        Config
	svc        Services
	echo       *echo.Echo
	logger     *slog.Logger
	auth       *authenticator
	idem       *idempotencyStore
	bodyLimits map[string]int64 // route pattern → limit, where not cfg.MaxBody
	bodyless   map[string]bool  // "METHOD pattern" of the operations that take no body
	metrics    *httpMetrics
	limiter    *orgLimiter // nil: no rate limit
	streamCap  *orgStreamCap
	inboxHTML  *web.Inbox
	// dedicatedPing: /readyz's ping of a saturated pool's Postgres, one at a time
	dedicatedPing singleflight.Group
	connLimit     atomic.Pointer[connLimit] // Serve's, when MaxConnections bounds it
	ops           *echo.Echo                // ServeOps's routes, when OpsAddr is set
}

// New builds the server and its routes.
func New(ctx context.Context, cfg Config, svc Services) (*Server, error) {
	cfg = cfg.withDefaults()
	if svc.DB == nil {
		return nil, errors.New("api: Services.DB is required")
	}
	auth, err := newAuthenticator(ctx, cfg.Auth)
	if err != nil {
		return nil, err
	}
	inboxHTML, err := web.NewInbox()
	if err != nil {
		return nil, fmt.Errorf("loading the inbox page: %w", err)
	}
	metrics, err := newHTTPMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, svc: svc, logger: cfg.Logger, auth: auth,
		idem:       &idempotencyStore{db: svc.DB, logger: cfg.Logger, retention: cfg.IdempotencyRetention},
		bodyLimits: map[string]int64{},
		metrics:    metrics,
		limiter:    newOrgLimiter(cfg.OrgRate, cfg.OrgBurst),
		streamCap:  newOrgStreamCap(cfg.OrgMaxStreams, cfg.MaxConnections),
		inboxHTML:  inboxHTML,
	}
	s.echo = s.newEcho()
	if cfg.OpsAddr != "" {
		// The same middleware as the API's listener: its probes and scrapes
		// count in reveille_http_requests_total and have access log lines
		// and request ids too — without them, 503s of /readyz there (the
		// documented alert) were never counted, and each was logged only
		// as a failure with no request id.
		s.ops = s.newEcho()
		s.opsRoutes(s.ops, true)
	}
	if s.bodyless, err = bodylessOperations(); err != nil {
		return nil, err
	}
	if err := cfg.Registry.Register(newDependencyUp(s)); err != nil {
		return nil, fmt.Errorf("api: register reveille_dependency_up: %w", err)
	}
	s.routes()
	return s, nil
}

// newEcho is a router with the middleware every listener's requests go
// through: request id, access log and metrics, panic recovery, body limit.
func (s *Server) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.Use(dropUnfitRequestID)
	e.Use(middleware.RequestIDWithConfig(middleware.RequestIDConfig{
		Generator: func() string { return newRequestID() },
	}))
	e.Use(s.accessLog)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true, LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
		s.logger.Error("handler panic", "error", err.Error(), "stack", string(stack), "request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		return err
	}}))
	e.Use(s.limitBody)
	return e
}

// Handler is the server's http.Handler (tests drive it directly).
func (s *Server) Handler() http.Handler { return s.echo }

// Echo exposes the router (the OpenAPI test lists its routes).
func (s *Server) Echo() *echo.Echo { return s.echo }

// routes registers every route. Domain route groups add themselves here.
func (s *Server) routes() {
	e := s.echo
	// (HEAD beside GET on the routes probes and browsers fetch: net/http
	// sends a HEAD answer's headers and drops its body)
	getHead := []string{http.MethodGet, http.MethodHead}
	s.opsRoutes(e, s.cfg.OpsAddr == "")
	e.Match(getHead, "/openapi.json", s.openapi)
	s.inboxPageRoutes()

	s.route(http.MethodGet, "/v1/whoami", func(c echo.Context) error { return c.JSON(http.StatusOK, PrincipalFrom(c)) }, anyRole)
	s.streamRoutes()
	s.mandateRoutes()
	s.wakeupRoutes()
	s.workRoutes()
	s.approvalRoutes()
	s.inboxRoutes()
	s.webhookRoutes()
}

// opsRoutes registers the probes, and /metrics when withMetrics.
func (s *Server) opsRoutes(e *echo.Echo, withMetrics bool) {
	getHead := []string{http.MethodGet, http.MethodHead}
	e.Match(getHead, "/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.Match(getHead, "/readyz", s.readyz)
	if withMetrics {
		e.Match(getHead, "/metrics", echo.WrapHandler(promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry})))
	}
}

// anyRole lets every authenticated principal through.
var anyRole []string

// route registers an authenticated route that needs one of roles (anyRole:
// none in particular), with extra middleware such as s.idempotent(). Its
// requests count against the org's rate limit, and its path and query
// parameters must be text (checkParams).
// Routes are registered one by one, not through an echo group with
// middleware, because such a group answers 404 instead of 405 for a known
// path with the wrong method.
func (s *Server) route(method, path string, h echo.HandlerFunc, roles []string, mw ...echo.MiddlewareFunc) {
	chain := []echo.MiddlewareFunc{s.auth.middleware}
	if s.limiter != nil {
		chain = append(chain, s.rateLimit)
	}
	if len(roles) > 0 {
		chain = append(chain, requireRole(roles...))
	}
	chain = append(chain, checkParams)
	// Its series is there from the start, at 0 (an alert on a rate or on an
	// absent series needs it before the first 429); routes are few.
	s.metrics.rateLimited.WithLabelValues(path)
	s.echo.Add(method, path, h, append(chain, mw...)...)
}

// idempotent marks a POST route as honouring Idempotency-Key.
func (s *Server) idempotent() echo.MiddlewareFunc { return s.idem.middleware }

// setBodyLimit gives a route its own body limit (streams).
func (s *Server) setBodyLimit(routePath string, limit int64) { s.bodyLimits[routePath] = limit }

// readyz is 503 only when Postgres does not answer: every request needs
// it. Another dependency that is down (Temporal) is reported in checks as
// "down: <reason>" with a 200, for the replica still does its work — wake
// signals wait in the outbox until Temporal is back — and a load balancer
// that took it out of rotation would refuse that work for nothing (issue
// 15, which overrides SPEC §2 here).
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
	defer cancel()
	results := s.checkDependencies(ctx, readyOthersTimeout)
	status := map[string]string{}
	for _, r := range results {
		status[r.name] = "ok"
		if r.err != nil {
			status[r.name] = "down: " + r.err.Error()
		}
	}
	if pg := results[0]; pg.err != nil {
		if err := c.Request().Context().Err(); err != nil {
			// the prober left (its own timeout): a 499, not "not ready"
			return fmt.Errorf("readiness: %w", err)
		}
		// Written here, not returned: a probe answered "not ready" is the
		// probe working, not a request that failed, and the error handler
		// would log each one (every second, per prober, for the whole
		// outage) beside its access log line.
		writeProblem(c, NewProblem(http.StatusServiceUnavailable, "not-ready", "not ready: postgres unreachable").With("checks", status))
		return nil
	}
	return c.JSON(http.StatusOK, map[string]any{"status": "ready", "checks": status})
}

// readyTimeout bounds each dependency check of /readyz and of a scrape.
const readyTimeout = 3 * time.Second

// readyOthersTimeout bounds, in /readyz, the checks that do not decide its
// status (Temporal): a hung one must not hold the answer past a prober's
// timeout (Kubernetes': 1 s), which would take a ready replica out.
const readyOthersTimeout = 500 * time.Millisecond

// sameBound, as checkDependencies' othersTimeout: every check has ctx's
// bound (the scrape's reveille_dependency_up).
const sameBound time.Duration = 0

// dependencyResult is one readiness check's answer.
type dependencyResult struct {
	name string
	err  error
}

// checkDependencies asks Postgres (always first in the answer) and every
// extra check at once, so that a hung one does not delay the others.
func (s *Server) checkDependencies(ctx context.Context, othersTimeout time.Duration) []dependencyResult {
	checks := append([]ReadinessCheck{{Name: "postgres", Check: s.pingPostgres}}, s.svc.Ready...)
	results := make([]dependencyResult, len(checks))
	var wg sync.WaitGroup
	for i, chk := range checks {
		wg.Go(func() {
			cctx := ctx
			if i > 0 && othersTimeout > 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, othersTimeout)
				defer cancel()
			}
			results[i] = dependencyResult{name: chk.Name, err: chk.Check(cctx)}
		})
	}
	wg.Wait()
	return results
}

// pingPostgres asks Postgres whether it answers: through the pool, or,
// while every pooled connection is busy, on a connection of its own (one
// at a time, whatever the probes: those that come together share its
// answer, so the replica's connections grow by one at most). A replica
// saturated by contention (spends queued on one mandate's row) still
// reaches Postgres; asked through the pool, the ping waited for a
// connection until it gave up and the replica reported Postgres
// unreachable — every replica the contention saturated left the load
// balancer's rotation at once.
func (s *Server) pingPostgres(ctx context.Context) error {
	db := s.svc.DB
	if st := db.Stat(); st.AcquiredConns() < st.MaxConns() {
		return db.Ping(ctx)
	}
	ch := s.dedicatedPing.DoChan("postgres", func() (any, error) {
		// (its own bound: the first prober's may be shorter than the others')
		pctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		c, err := connectDedicated(pctx, db.Config().ConnConfig)
		if err != nil {
			return nil, err
		}
		defer c.Close(pctx)
		return nil, c.Ping(pctx)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connectDedicated dials /readyz's own connection. The previous probe's,
// just closed, may still count against a connection budget (its backend
// exits after the client has gone): "too many connections" (53300) is
// tried again for a moment rather than answered as Postgres unreachable.
func connectDedicated(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	giveUp := time.Now().Add(dedicatedRedialFor)
	for {
		c, err := pgx.ConnectConfig(ctx, cfg)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "53300" || time.Now().After(giveUp) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// dedicatedRedialFor bounds connectDedicated's tries past "too many
// connections": well within a prober's timeout (Kubernetes': 1 s).
const dedicatedRedialFor = 250 * time.Millisecond

func (s *Server) openapi(c echo.Context) error {
	doc, err := OpenAPIDocument()
	if err != nil {
		return fmt.Errorf("openapi document: %w", err)
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, doc)
}

// limitBody caps the request body: Content-Length over the limit is refused
// at once, a longer chunked body fails when read (both 413). An operation
// that takes no body (the OpenAPI document declares none) is given none,
// whatever was sent: nothing reads it — not even to hash it for an
// Idempotency-Key — so it can neither be refused with a 413 its contract
// does not declare nor make a retry "a different request". Its
// ContentLength stays as sent: net/http, seeing an unread body after the
// handler, drains it or closes the connection, so its bytes are never read
// as the next request (set to 0, a body past 256 KiB was left on the
// connection and parsed as one: request smuggling).
func (s *Server) limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if s.bodyless[req.Method+" "+c.Path()] {
			req.Body = http.NoBody
			return next(c)
		}
		limit, ok := s.bodyLimits[c.Path()]
		if !ok {
			limit = s.cfg.MaxBody
		}
		if req.ContentLength > limit {
			return tooLargeProblem("body-too-large", "body", "request body exceeds "+strconv.FormatInt(limit, 10)+" bytes")
		}
		req.Body = http.MaxBytesReader(c.Response(), req.Body, limit)
		return next(c)
	}
}

// accessLog writes one JSON line per request and records HTTP metrics.
func (s *Server) accessLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		status := c.Response().Status
		elapsed := time.Since(start)
		s.metrics.observe(c.Request().Method, route, status, elapsed)
		attrs := []any{
			"method", logCut(c.Request().Method, maxLoggedMethod), "path", logCut(c.Request().URL.Path, maxLoggedPath), "route", route,
			"status", status, "duration_ms", float64(elapsed.Microseconds()) / 1000,
			"bytes_out", c.Response().Size, "request_id", c.Response().Header().Get(echo.HeaderXRequestID),
		}
		if p := PrincipalFrom(c); p.OrgID != "" {
			attrs = append(attrs, "org_id", p.OrgID, "sub", p.Sub)
		}
		s.logger.Info("http request", attrs...)
		return nil
	}
}

// The access log writes a request's method and path at most this long:
// both are the client's to choose (net/http reads a request line up to
// its 1 MiB header limit), and a client could otherwise make every line it
// causes as long as that.
const (
	maxLoggedMethod = 64
	maxLoggedPath   = 2048
)

// logCut is s cut to at most limit bytes (on a UTF-8 boundary) and marked
// as cut with the length it had, so that a cut value is never taken for
// the whole.
func logCut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return prefixOf(s, limit) + "…(cut, " + strconv.Itoa(len(s)) + " bytes)"
}

// prefixOf is the longest prefix of s of at most n bytes that ends on a
// UTF-8 boundary.
func prefixOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Run serves until ctx is canceled, then drains in-flight requests for up to
// ShutdownTimeout.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// WriteTimeout bounds every response; SSE handlers move the deadline
	// before each write (sseWrite), so a stream lasts as long as its client
	// reads it.
	connState := s.metrics.connState
	if s.cfg.MaxConnections > 0 {
		limit := newConnLimit(s.cfg.MaxConnections, s.metrics)
		s.connLimit.Store(limit)
		ln = limit.listener(ln)
		connState = func(c net.Conn, state http.ConnState) {
			s.metrics.connState(c, state)
			limit.connState(c, state)
		}
	}
	return s.serve(ctx, ln, s.echo, connState)
}

// ServeOps serves /healthz, /readyz and /metrics on ln (Config.OpsAddr)
// until ctx is canceled, with the API's timeouts and no connection bound.
func (s *Server) ServeOps(ctx context.Context, ln net.Listener) error {
	if s.ops == nil {
		return errors.New("api: ServeOps without Config.OpsAddr")
	}
	return s.serve(ctx, ln, s.ops, nil)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler, connState func(net.Conn, http.ConnState)) error {
	srv := &http.Server{
		Handler: h, ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.WriteTimeout, IdleTimeout: s.cfg.IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ConnState:   connState,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still in flight past the bound (a client slow to send
		// its body, a long wait) are cut: the stop itself went as it should.
		s.logger.Warn("requests still in flight at the end of the drain were cut", "shutdown_timeout", s.cfg.ShutdownTimeout.String(), "error", err.Error())
		_ = srv.Close()
	}
	return nil
}

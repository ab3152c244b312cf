package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/retention"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/webhooks"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// settings is every knob of every command: flags where the issue names
// one, environment variables for all, each documented in the README. Each
// package gets its part as its own typed Config (serviceConfig).
type settings struct {
	Addr           string         // --addr / REVEILLE_ADDR
	OpsAddr        string         // REVEILLE_OPS_ADDR ("": the probes and /metrics on Addr)
	DataDir        string         // --data-dir / REVEILLE_DATA_DIR
	TemporalPort   int            // --temporal-port (dev, devstack)
	PostgresPort   int            // --postgres-port (devstack)
	DatabaseURL    string         // DATABASE_URL
	TemporalAddr   string         // TEMPORAL_ADDRESS
	Namespace      string         // TEMPORAL_NAMESPACE
	JWTSecrets     []string       // REVEILLE_JWT_SECRET: comma list; the first signs, all verify
	JWKSURL        string         // REVEILLE_JWKS_URL
	JWTIssuer      string         // REVEILLE_JWT_ISSUER
	JWTAudience    string         // REVEILLE_JWT_AUDIENCE
	OperatorOrgs   []string       // REVEILLE_OPERATOR_ORGS
	MaxBody        int64          // REVEILLE_MAX_BODY
	HeaderTimeout  time.Duration  // REVEILLE_READ_HEADER_TIMEOUT
	ReadTimeout    time.Duration  // REVEILLE_READ_TIMEOUT
	WriteTimeout   time.Duration  // REVEILLE_WRITE_TIMEOUT
	IdleTimeout    time.Duration  // REVEILLE_IDLE_TIMEOUT
	OrgRate        float64        // REVEILLE_ORG_RATE
	OrgMaxStreams  int            // REVEILLE_ORG_MAX_STREAMS: 0 turns the cap off (-1 here)
	MaxConns       int            // REVEILLE_MAX_CONNECTIONS (unset: api's default, half the open-file limit; 0 turns the bound off, -1 here)
	Pools          map[string]int // REVEILLE_POOLS
	RecoveryPeriod time.Duration  // REVEILLE_RECOVERY_PERIOD
	HeartbeatLimit time.Duration  // REVEILLE_HEARTBEAT_TIMEOUT
	HookTimeout    time.Duration  // REVEILLE_HOOK_TIMEOUT
	WorkRetention  time.Duration  // REVEILLE_WORK_RETENTION
	OrgMaxPending  int            // REVEILLE_ORG_MAX_PENDING: 0 turns the cap off (workpool.NoPendingLimit)
	HTTPAllowed    []string       // REVEILLE_HTTP_ALLOWED_HOSTS
	HTTPNets       []string       // REVEILLE_HTTP_ALLOWED_NETS
	HTTPTimeout    time.Duration  // REVEILLE_HTTP_TIMEOUT (0: the work's timeout alone)
	ApprovalTTL    time.Duration  // REVEILLE_APPROVAL_TTL
	ToolTTL        time.Duration  // REVEILLE_TOOL_APPROVAL_TTL
	NotFoundGrace  time.Duration  // REVEILLE_SIGNAL_NOTFOUND_GRACE
	StreamChunk    int64          // REVEILLE_STREAM_MAX_CHUNK
	StreamRequest  int64          // REVEILLE_STREAM_MAX_REQUEST
	StreamChunks   int            // REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST
	StreamKeep     time.Duration  // REVEILLE_STREAM_RETENTION
	ShutdownGrace  time.Duration  // REVEILLE_SHUTDOWN_GRACE
	Worker         bool           // --worker / REVEILLE_WORKER: run the Temporal worker (on in dev)
	LogLevel       string         // REVEILLE_LOG_LEVEL ("": info; the wake bench's default is error)
	APIURL         string         // REVEILLE_API_URL: the engine the demo talks to
	WebhookPool    string         // REVEILLE_WEBHOOK_POOL: the pool approval webhooks are delivered on
	PublicURL      string         // REVEILLE_PUBLIC_URL: the engine as people reach it (Slack messages link to its /inbox)
	Retention      retentionSettings
}

// retentionSettings are how long each table's settled rows are kept
// (internal/retention) and how often they are purged.
type retentionSettings struct {
	IdempotencyRecords time.Duration // REVEILLE_IDEMPOTENCY_RETENTION
	SpendKeys          time.Duration // REVEILLE_SPEND_KEY_RETENTION
	MandateApprovals   time.Duration // REVEILLE_MANDATE_APPROVAL_RETENTION
	Wakeups            time.Duration // REVEILLE_WAKEUP_RETENTION
	ToolApprovals      time.Duration // REVEILLE_TOOL_APPROVAL_RETENTION
	QueueMessages      time.Duration // REVEILLE_QUEUE_RETENTION
	SessionEvents      time.Duration // REVEILLE_SESSION_EVENT_RETENTION
	ApprovalEvents     time.Duration // REVEILLE_APPROVAL_EVENT_RETENTION
	Interval           time.Duration // REVEILLE_RETENTION_INTERVAL
}

func envRetention(errs *[]error) retentionSettings {
	return retentionSettings{
		IdempotencyRecords: envDuration("REVEILLE_IDEMPOTENCY_RETENTION", api.DefaultIdempotencyRetention, minDuration, errs),
		SpendKeys:          envDuration("REVEILLE_SPEND_KEY_RETENTION", retention.DefaultSpendKeys, minDuration, errs),
		MandateApprovals:   envDuration("REVEILLE_MANDATE_APPROVAL_RETENTION", retention.DefaultSettled, minDuration, errs),
		Wakeups:            envDuration("REVEILLE_WAKEUP_RETENTION", retention.DefaultSettled, minDuration, errs),
		ToolApprovals:      envDuration("REVEILLE_TOOL_APPROVAL_RETENTION", retention.DefaultSettled, minDuration, errs),
		QueueMessages:      envDuration("REVEILLE_QUEUE_RETENTION", retention.DefaultSettled, minDuration, errs),
		SessionEvents:      envDuration("REVEILLE_SESSION_EVENT_RETENTION", retention.DefaultSettled, minDuration, errs),
		ApprovalEvents:     envDuration("REVEILLE_APPROVAL_EVENT_RETENTION", retention.DefaultSettled, minDuration, errs),
		Interval:           envDuration("REVEILLE_RETENTION_INTERVAL", retention.DefaultInterval, minDuration, errs),
	}
}

// config is the purge's part of the settings (the API's records' window
// is the API's: serviceConfig passes it there).
func (r retentionSettings) config() retention.Config {
	return retention.Config{SpendKeys: r.SpendKeys, MandateApprovals: r.MandateApprovals, Wakeups: r.Wakeups,
		ToolApprovals: r.ToolApprovals, QueueMessages: r.QueueMessages, SessionEvents: r.SessionEvents,
		ApprovalEvents: r.ApprovalEvents, Interval: r.Interval}
}

// minHeartbeatTimeout is the least REVEILLE_HEARTBEAT_TIMEOUT: the pool's
// executors heartbeat every min(5s, timeout/3) (workpool.Config), so at it
// a heartbeat goes out every second and two in a row may be late before a
// healthy attempt is recovered as dead.
const minHeartbeatTimeout = 3 * time.Second

// minDuration is the least value of every duration setting but the two
// below: a loop ticking every 1ms spins (REVEILLE_RETENTION_INTERVAL=1ms
// ran a purge pass back to back, thousands of log lines a second), a
// timeout or TTL that short fails every request, hook call or approval,
// and a retention that short drops a record before anyone reads it —
// never what an operator meant, so it stops the start instead.
const minDuration = time.Second

// minRecoveryPeriod is the least REVEILLE_RECOVERY_PERIOD, below
// minDuration: recovery is one indexed query per pool, cheap ten times a
// second, and the fault suite runs it every 500ms so that a killed
// replica's work is recovered within seconds.
const minRecoveryPeriod = 100 * time.Millisecond

// checkAPIURLs checks the API URL(s) demo and load talk to (--api, else
// REVEILLE_API_URL): only they read it, after their flags.
func checkAPIURLs(v string) error {
	for _, u := range list(v) {
		if parsed, err := url.Parse(u); err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			return fmt.Errorf("--api / REVEILLE_API_URL=%q: want absolute http(s) URLs such as http://localhost:8080 (a comma list for engine load)", v)
		}
	}
	return nil
}

// envConfig reads settings from the environment — the one place in the
// engine that does — reporting every malformed value at once, each naming
// its variable.
func envConfig() (settings, error) {
	var errs []error
	s := settings{
		Addr:         listenAddr("REVEILLE_ADDR", envOr("REVEILLE_ADDR", ":8080"), &errs),
		OpsAddr:      os.Getenv("REVEILLE_OPS_ADDR"),
		DataDir:      envOr("REVEILLE_DATA_DIR", "./.reveille"),
		TemporalPort: 7233,
		DatabaseURL:  databaseURL(os.Getenv("DATABASE_URL")),
		TemporalAddr: temporalAddr(os.Getenv("TEMPORAL_ADDRESS"), &errs),
		Namespace:    envOr("TEMPORAL_NAMESPACE", "default"),
		JWTSecrets:   list(os.Getenv("REVEILLE_JWT_SECRET")),
		JWKSURL:      jwksURL(os.Getenv("REVEILLE_JWKS_URL"), &errs),
		// (trimmed as the secrets are: a mounted file's newline, or a blank
		// value, must not count as set)
		JWTIssuer:    strings.TrimSpace(os.Getenv("REVEILLE_JWT_ISSUER")),
		JWTAudience:  strings.TrimSpace(os.Getenv("REVEILLE_JWT_AUDIENCE")),
		OperatorOrgs: list(os.Getenv("REVEILLE_OPERATOR_ORGS")),
		HTTPAllowed:  list(os.Getenv("REVEILLE_HTTP_ALLOWED_HOSTS")),
		HTTPNets:     list(os.Getenv("REVEILLE_HTTP_ALLOWED_NETS")),
		APIURL:       envOr("REVEILLE_API_URL", "http://localhost:8080"),
	}
	if s.OpsAddr != "" {
		listenAddr("REVEILLE_OPS_ADDR", s.OpsAddr, &errs)
	}
	s.LogLevel = envLogLevel("REVEILLE_LOG_LEVEL", &errs)
	s.MaxBody = envInt("REVEILLE_MAX_BODY", 1<<20, &errs)
	s.HeaderTimeout = envDuration("REVEILLE_READ_HEADER_TIMEOUT", api.DefaultReadHeaderTimeout, minDuration, &errs)
	s.ReadTimeout = envDuration("REVEILLE_READ_TIMEOUT", api.DefaultReadTimeout, minDuration, &errs)
	s.WriteTimeout = envDuration("REVEILLE_WRITE_TIMEOUT", api.DefaultWriteTimeout, minDuration, &errs)
	s.IdleTimeout = envDuration("REVEILLE_IDLE_TIMEOUT", api.DefaultIdleTimeout, minDuration, &errs)
	s.OrgRate = envRate("REVEILLE_ORG_RATE", 10_000, &errs)
	s.OrgMaxStreams = envCap("REVEILLE_ORG_MAX_STREAMS", api.DefaultOrgMaxStreams, -1, &errs)
	s.MaxConns = envCap("REVEILLE_MAX_CONNECTIONS", 0, -1, &errs)
	s.StreamChunk = envInt("REVEILLE_STREAM_MAX_CHUNK", 1<<20, &errs)
	s.StreamRequest = envInt("REVEILLE_STREAM_MAX_REQUEST", 8<<20, &errs)
	s.StreamChunks = int(envInt("REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST", streams.DefaultMaxChunks, &errs))
	s.RecoveryPeriod = envDuration("REVEILLE_RECOVERY_PERIOD", 10*time.Second, minRecoveryPeriod, &errs)
	// At least minHeartbeatTimeout: executors heartbeat every third of it,
	// at most 5s apart, so a shorter one fails healthy work as stopped.
	s.HeartbeatLimit = envDuration("REVEILLE_HEARTBEAT_TIMEOUT", 30*time.Second, minHeartbeatTimeout, &errs)
	s.HTTPTimeout = envDuration("REVEILLE_HTTP_TIMEOUT", 0, minDuration, &errs)
	s.HookTimeout = envDuration("REVEILLE_HOOK_TIMEOUT", workpool.DefaultHookTimeout, minDuration, &errs)
	if s.HookTimeout > workpool.MaxHookTimeout {
		errs = append(errs, fmt.Errorf("REVEILLE_HOOK_TIMEOUT=%s: want at most %s (a hook call holds up the completions recorded with it)", s.HookTimeout, workpool.MaxHookTimeout))
	}
	s.WorkRetention = envDuration("REVEILLE_WORK_RETENTION", 24*time.Hour, minDuration, &errs)
	s.ApprovalTTL = envDuration("REVEILLE_APPROVAL_TTL", 24*time.Hour, minDuration, &errs)
	s.ToolTTL = envDuration("REVEILLE_TOOL_APPROVAL_TTL", time.Hour, minDuration, &errs)
	s.NotFoundGrace = envDuration("REVEILLE_SIGNAL_NOTFOUND_GRACE", 60*time.Second, minDuration, &errs)
	s.StreamKeep = envDuration("REVEILLE_STREAM_RETENTION", 7*24*time.Hour, minDuration, &errs)
	s.ShutdownGrace = envDuration("REVEILLE_SHUTDOWN_GRACE", service.DefaultShutdownGrace, minDuration, &errs)
	s.Worker = envBool("REVEILLE_WORKER", false, &errs)
	s.Pools = envPools("REVEILLE_POOLS", workpool.DefaultPools, &errs)
	s.OrgMaxPending = envCap("REVEILLE_ORG_MAX_PENDING", workpool.DefaultMaxPendingPerOrg, workpool.NoPendingLimit, &errs)
	s.Retention = envRetention(&errs)
	if s.StreamChunk > streams.MaxChunkLimit {
		errs = append(errs, fmt.Errorf("REVEILLE_STREAM_MAX_CHUNK=%d: want at most %d (16 MiB): a live reader gets a chunk as one line of base64", s.StreamChunk, streams.MaxChunkLimit))
	} else if s.StreamChunk > s.StreamRequest {
		errs = append(errs, fmt.Errorf("REVEILLE_STREAM_MAX_CHUNK=%d exceeds REVEILLE_STREAM_MAX_REQUEST=%d: a chunk must fit in a request", s.StreamChunk, s.StreamRequest))
	}
	if _, err := httpwork.ParseAllowList(s.HTTPAllowed); err != nil {
		errs = append(errs, err)
	}
	if _, err := httpwork.ParseNets(s.HTTPNets); err != nil {
		errs = append(errs, err)
	}
	s.WebhookPool = webhookPool(os.Getenv("REVEILLE_WEBHOOK_POOL"), s.Pools, &errs)
	s.PublicURL = publicURL(os.Getenv("REVEILLE_PUBLIC_URL"), &errs)
	return s, errors.Join(errs...)
}

// databaseURL reads DATABASE_URL: "" when blank (pgx reads an empty
// string as the local socket's default database); a URL without the
// whitespace around it (a secret file's newline, CRLF: a URL holds none);
// a key=value string as given, where an escaped trailing space is the
// last value's (password=abc\ ).
func databaseURL(v string) string {
	t := strings.TrimSpace(v)
	if t == "" || strings.HasPrefix(t, "postgres://") || strings.HasPrefix(t, "postgresql://") {
		return t
	}
	return v
}

// flagVars are the variables the commands' flags stand for, by flag name.
var flagVars = map[string]string{"addr": "REVEILLE_ADDR", "worker": "REVEILLE_WORKER", "data-dir": "REVEILLE_DATA_DIR",
	"temporal": "TEMPORAL_ADDRESS", "api": "REVEILLE_API_URL"}

// overridden is envErr without the errors of the variables whose flags
// (flag name → variable) the command line set: flags override the
// environment (README § Configuration), a malformed variable included.
// Each variable's error begins with "NAME=" (listenAddr, envBool,
// temporalAddr, …).
func overridden(envErr error, fs *flag.FlagSet, vars map[string]string) error {
	if envErr == nil {
		return nil
	}
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if v, ok := vars[f.Name]; ok {
			set = append(set, v+"=")
		}
	})
	errs := []error{envErr}
	if j, ok := envErr.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var kept []error
	for _, err := range errs {
		if !slices.ContainsFunc(set, func(prefix string) bool { return strings.HasPrefix(err.Error(), prefix) }) {
			kept = append(kept, err)
		}
	}
	return errors.Join(kept...)
}

// bindFlags adds the flags of serve and dev. --data-dir is dev's alone:
// serve keeps nothing on disk (its Postgres, Temporal and secret are
// external), so it refuses the flag as any unknown one rather than take
// it and do nothing with it.
func (s *settings) bindFlags(fs *flag.FlagSet, dev bool) {
	fs.Var(addrFlag{&s.Addr}, "addr", "listen address `host:port` (REVEILLE_ADDR)")
	if dev {
		fs.StringVar(&s.DataDir, "data-dir", s.DataDir, "data directory: dev Postgres cluster, Temporal SQLite file, dev secret (REVEILLE_DATA_DIR)")
		fs.Var(portFlag{&s.TemporalPort}, "temporal-port", "frontend `port` of the embedded Temporal dev server (0: a free one)")
	} else {
		fs.BoolVar(&s.Worker, "worker", s.Worker, "also run the Temporal worker of the reference workflow (REVEILLE_WORKER)")
	}
}

// serviceConfig hands every package its typed part of the settings.
func (s settings) serviceConfig(logger *slog.Logger) service.Config {
	c := service.Config{
		DatabaseURL: s.DatabaseURL, TemporalAddress: s.TemporalAddr, Namespace: s.Namespace,
		API: api.Config{Addr: s.Addr, OpsAddr: s.OpsAddr, MaxBody: s.MaxBody, ReadHeaderTimeout: s.HeaderTimeout, ReadTimeout: s.ReadTimeout,
			WriteTimeout: s.WriteTimeout, IdleTimeout: s.IdleTimeout, OrgRate: s.OrgRate, OrgMaxStreams: s.OrgMaxStreams, MaxConnections: s.MaxConns,
			Auth: s.authConfig(), IdempotencyRetention: s.Retention.IdempotencyRecords},
		Workpool:      s.workpoolConfig(),
		HTTPWork:      httpwork.Config{AllowedHosts: s.HTTPAllowed, AllowedNets: s.HTTPNets, Timeout: s.HTTPTimeout},
		Mandates:      mandates.Config{ApprovalTTL: s.ApprovalTTL},
		Streams:       s.streamsConfig(),
		Approvals:     approvals.Config{TTL: s.ToolTTL},
		Webhooks:      webhooks.Config{Pool: s.WebhookPool, PublicURL: s.PublicURL},
		Dispatcher:    queue.DispatcherConfig{NotFoundGrace: s.NotFoundGrace},
		Retention:     s.Retention.config(),
		ShutdownGrace: s.ShutdownGrace,
		Version:       buildVersion(),
		Logger:        logger,
	}
	if s.Worker {
		c.Worker = &service.WorkerConfig{}
	}
	return c
}

// workpoolConfig is the pool's part of the settings.
func (s settings) workpoolConfig() workpool.Config {
	return workpool.Config{Pools: maps.Clone(s.Pools), RecoveryPeriod: s.RecoveryPeriod, HeartbeatTimeout: s.HeartbeatLimit,
		WorkRetention: s.WorkRetention, MaxPendingPerOrg: s.OrgMaxPending, HookTimeout: s.HookTimeout}
}

// streamsConfig is the streams' part of the settings.
func (s settings) streamsConfig() streams.Config {
	return streams.Config{MaxChunk: s.StreamChunk, MaxRequest: s.StreamRequest, MaxChunksPerRequest: s.StreamChunks, Retention: s.StreamKeep}
}

// authConfig is the API's token verification.
func (s settings) authConfig() api.AuthConfig {
	cfg := api.AuthConfig{JWKSURL: s.JWKSURL, Issuer: s.JWTIssuer, Audience: s.JWTAudience, OperatorOrgs: s.OperatorOrgs}
	for _, secret := range s.JWTSecrets {
		cfg.Secrets = append(cfg.Secrets, []byte(secret))
	}
	return cfg
}

// signingSecret is the secret that signs tokens: the first of
// REVEILLE_JWT_SECRET's list ("" when there is none).
func (s settings) signingSecret() string {
	if len(s.JWTSecrets) == 0 {
		return ""
	}
	return s.JWTSecrets[0]
}

// webhookPool is the pool approval webhooks are delivered on: the one
// named, which must be created at start (one of REVEILLE_POOLS), else
// "default", else — REVEILLE_POOLS without it — the first pool by name, so
// a delivery never names a pool that may not exist.
func webhookPool(v string, pools map[string]int, errs *[]error) string {
	names := slices.Sorted(maps.Keys(pools))
	if v = strings.TrimSpace(v); v != "" {
		if _, ok := pools[v]; !ok {
			*errs = append(*errs, fmt.Errorf("REVEILLE_WEBHOOK_POOL=%q: not one of REVEILLE_POOLS' pools (%s)", v, strings.Join(names, ", ")))
		} else if v == wakeup.DefaultPool {
			*errs = append(*errs, fmt.Errorf("REVEILLE_WEBHOOK_POOL=%q: that pool runs wake-ups' work only; name another of REVEILLE_POOLS' pools", v))
		}
		return v
	}
	// (never the wake-up pool: its slots are the wake-ups')
	names = slices.DeleteFunc(names, func(n string) bool { return n == wakeup.DefaultPool })
	if _, ok := pools["default"]; ok {
		return "default"
	}
	if len(names) == 0 {
		*errs = append(*errs, fmt.Errorf("REVEILLE_POOLS has no pool for approval webhooks (%s runs wake-ups' work only): add one, such as default=5", wakeup.DefaultPool))
		return "default"
	}
	return names[0]
}

// listenAddr checks a listen address as net.Listen("tcp") reads it —
// host:port, the host empty for every interface, the port a number up to
// 65535 or a service name — so that a bad one stops the start before the
// database is touched, named by what set it (name). The host is resolved
// only when the API listens.
func listenAddr(name, v string, errs *[]error) string {
	if err := checkListenAddr(v); err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q: %w", name, v, err))
	}
	return v
}

func checkListenAddr(v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("want a listen address host:port such as :8080 or 127.0.0.1:8080 (%w)", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err == nil || port == "" {
		return nil
	}
	if _, err := net.LookupPort("tcp", port); err != nil || strings.TrimLeft(port, "0123456789") == "" {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// addrFlag is --addr, checked as REVEILLE_ADDR is: the flag package names
// the flag in the error.
type addrFlag struct{ p *string }

func (a addrFlag) String() string {
	if a.p == nil {
		return ""
	}
	return *a.p
}

func (a addrFlag) Set(v string) error {
	if err := checkListenAddr(v); err != nil {
		return err
	}
	*a.p = v
	return nil
}

// portFlag is a port flag (--temporal-port, --postgres-port), checked as
// it is parsed: a port out of range used to pass, and engine dev ran
// initdb and started Postgres before Temporal refused it. The flag
// package names the flag in the error.
type portFlag struct{ p *int }

func (f portFlag) String() string {
	if f.p == nil {
		return "0" // the zero value, so that help shows no default of 0
	}
	return strconv.Itoa(*f.p)
}

func (f portFlag) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 65535 {
		return errors.New("want a port from 1 to 65535 (0: a free one)")
	}
	*f.p = n
	return nil
}

// temporalAddr reads the Temporal frontend: host:port with a numeric
// port, or a gRPC resolver target (dns:///host:port); "" for the default.
func temporalAddr(v string, errs *[]error) string {
	if err := checkTemporalAddr(v); err != nil {
		*errs = append(*errs, fmt.Errorf("TEMPORAL_ADDRESS=%q: %w", v, err))
	}
	return v
}

// checkTemporalAddr checks a Temporal frontend address ("": the default).
func checkTemporalAddr(v string) error {
	if v == "" || strings.Contains(v, ":///") {
		return nil
	}
	host, port, err := net.SplitHostPort(v)
	if _, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil {
		return errors.New("want the frontend's host:port such as temporal.example.com:7233")
	}
	return nil
}

// jwksURL reads the JWKS address: absolute http(s), or "" for none.
func jwksURL(v string, errs *[]error) string {
	if v = strings.TrimSpace(v); v == "" {
		return ""
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		*errs = append(*errs, fmt.Errorf("REVEILLE_JWKS_URL=%q: want an absolute http(s) URL such as https://idp.example.com/.well-known/jwks.json", v))
		return ""
	}
	return v
}

// publicURL reads the engine's public base URL: absolute http(s), or "".
func publicURL(v string, errs *[]error) string {
	if v = strings.TrimSpace(v); v == "" {
		return ""
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		*errs = append(*errs, fmt.Errorf("REVEILLE_PUBLIC_URL=%q: want an absolute http(s) URL such as https://reveille.example.com", v))
		return ""
	}
	return strings.TrimRight(v, "/")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func list(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func envInt(name string, def int64, errs *[]error) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		*errs = append(*errs, fmt.Errorf("%s=%q: want a positive integer", name, v))
		return def
	}
	return n
}

// envRate reads a rate per second: a number ≥ 0, where 0 means no limit.
func envRate(name string, def float64, errs *[]error) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r < 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		*errs = append(*errs, fmt.Errorf("%s=%q: want a number of requests per second, 0 for no limit", name, v))
		return def
	}
	return r
}

// envDuration reads a duration of at least least (> 0), refusing a
// shorter one naming the variable and the bound.
func envDuration(name string, def, least time.Duration, errs *[]error) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		*errs = append(*errs, fmt.Errorf("%s=%q: want a duration of at least %s such as 30s or 24h", name, v, least))
		return def
	}
	if d < least {
		*errs = append(*errs, fmt.Errorf("%s=%s: want at least %s", name, d, least))
		return def
	}
	return d
}

// envPools reads pools as name=max_parallelism pairs (workpool.ParsePools).
func envPools(name, def string, errs *[]error) map[string]int {
	pools, err := workpool.ParsePools(envOr(name, def))
	if err == nil && len(pools) == 0 {
		err = fmt.Errorf("%q names no pool: want name=max_parallelism pairs such as %s", os.Getenv(name), def)
	}
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", name, err))
		pools, _ = workpool.ParsePools(def)
	}
	return pools
}

// envCap reads a cap: an integer ≥ 0, where 0 turns it off (returned as
// workpool.NoPendingLimit, the workpool's "no cap").
func envCap(name string, def, off int, errs *[]error) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		*errs = append(*errs, fmt.Errorf("%s=%q: want an integer ≥ 0 (0 turns the cap off)", name, v))
		return def
	}
	if n == 0 {
		return off
	}
	return n
}

// logLevels are the values REVEILLE_LOG_LEVEL takes.
var logLevels = []string{"debug", "info", "warn", "error"}

// envLogLevel reads a log level: one of logLevels (any case), or "" for
// the command's default. A level slog would read but that is not one of
// them (info+2) is refused as well, so the README's list is the whole truth.
func envLogLevel(name string, errs *[]error) string {
	v := os.Getenv(name)
	if v == "" {
		return ""
	}
	if l := strings.ToLower(strings.TrimSpace(v)); slices.Contains(logLevels, l) {
		return l
	}
	*errs = append(*errs, fmt.Errorf("%s=%q: want one of %s", name, v, strings.Join(logLevels, ", ")))
	return ""
}

func envBool(name string, def bool, errs *[]error) bool {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q: want true or false", name, v))
		return def
	}
	return b
}

// Package devtemporal runs an embedded Temporal development server inside the
// current process, for `engine dev` and `engine devstack`.
//
// The server runs all four Temporal services (frontend, history, matching and
// worker) in-process, persists everything to a single SQLite file under
// Options.DataDir so that workflows survive a restart, and exposes the
// frontend gRPC API on 127.0.0.1. It is meant for local development only: no
// TLS, no authorization, one history shard, no archival, no UI.
//
// The setup follows the Temporal CLI's `temporal server start-dev` (static
// membership, so no ringpop gossip ports) and go.temporal.io/server/temporaltest.
package devtemporal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
)

const (
	// defaultNamespace is used when Options.Namespace is empty.
	defaultNamespace = "default"
	// dbFileName is the SQLite file created inside Options.DataDir.
	dbFileName = "temporal.sqlite"
	// clusterName is the name of the single local cluster. It is persisted in
	// the SQLite file (cluster metadata and namespace replication config), so
	// it must never change.
	clusterName = "active"
	// localhost is the only interface any of the services listen on.
	localhost = "127.0.0.1"
	// readyTimeout bounds how long Start waits for the frontend to answer
	// when ctx has no earlier deadline.
	readyTimeout = time.Minute
)

// Options configures an embedded Temporal dev server.
type Options struct {
	// DataDir is the directory holding the SQLite database file
	// (<DataDir>/temporal.sqlite). It is created if missing. The schema is
	// set up the first time; after that the existing file is reused, so
	// namespaces, workflows and their histories survive a restart. Required.
	DataDir string
	// Port is the frontend gRPC port on 127.0.0.1. 0 picks a free port
	// (see Server.Address). Callers normally pass 7233, Temporal's default.
	// The internal services (history, matching, worker) always get free
	// ports, so several servers can run side by side.
	Port int
	// Namespace is registered at start if it does not exist yet. Empty means
	// "default".
	Namespace string
	// Logger receives Temporal's own log records at warn level and above
	// while the server runs; debug and info are dropped as noise. Records
	// logged during start-up are held back and only written if Start fails,
	// and records logged during Stop (canceled contexts, refused
	// connections) are discarded. Nil discards everything.
	Logger *slog.Logger
}

// Server is a running embedded Temporal dev server. Create it with Start and
// release it with Stop.
type Server struct {
	srv       temporal.Server
	addr      string
	namespace string
	dbPath    string
	logs      *logState

	stopOnce sync.Once
	stopErr  error
}

// Start sets up the SQLite database under opts.DataDir if needed, registers
// opts.Namespace, starts all Temporal services in-process and returns once the
// frontend at Address answers health checks and knows the namespace.
//
// ctx bounds the whole start-up (Start also gives up after one minute on its
// own); cancelling it after Start has returned has no effect on the server.
// If the frontend port is already taken, the returned error says so and wraps
// the underlying listen error (syscall.EADDRINUSE).
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.DataDir == "" {
		return nil, errors.New("devtemporal: Options.DataDir is required")
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("devtemporal: invalid frontend port %d", opts.Port)
	}
	if opts.Namespace == "" {
		opts.Namespace = defaultNamespace
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: resolve data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("devtemporal: create data dir: %w", err)
	}
	dbPath := filepath.Join(dataDir, dbFileName)
	// The SQLite plugin builds a "file:<path>?<params>" URI from the path
	// without escaping it.
	if strings.ContainsAny(dbPath, "?#") {
		return nil, fmt.Errorf("devtemporal: data dir %q must not contain '?' or '#'", dataDir)
	}

	if err := claimDB(dbPath); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			releaseDB(dbPath)
		}
	}()

	ports, err := pickPorts(opts.Port)
	if err != nil {
		return nil, err
	}

	sqlConf, err := prepareDB(dbPath, opts.Namespace)
	markOpened(dbPath)
	if err != nil {
		return nil, err
	}

	slogger := newServerLogger(logger)
	logs := slogger.state
	serverOpts, err := buildServerOptions(sqlConf, ports, slogger)
	if err != nil {
		return nil, err
	}

	var srv temporal.Server
	err = catchFatal(func() error {
		var err error
		srv, err = temporal.NewServer(serverOpts...)
		return err
	})
	if err != nil {
		logs.setPhase(phaseStopping, true)
		return nil, fmt.Errorf("devtemporal: create server: %w", portError(err, ports.frontend))
	}

	// temporal.Server.Start takes no context; run it aside so ctx is honoured.
	startDone := make(chan error, 1)
	go func() {
		err := catchFatal(srv.Start)
		logs.setPanicOnFatal(false)
		startDone <- err
	}()
	select {
	case err := <-startDone:
		if err != nil {
			logs.setPhase(phaseStopping, true)
			return nil, fmt.Errorf("devtemporal: start server: %w", portError(err, ports.frontend))
		}
	case <-ctx.Done():
		logs.setPhase(phaseStopping, true)
		// Let the start finish in the background, then tear it down.
		started = true // releaseDB happens in the goroutine below instead.
		go func() {
			if err := <-startDone; err == nil {
				_ = srv.Stop()
			}
			releaseDB(dbPath)
		}()
		return nil, fmt.Errorf("devtemporal: start server: %w", ctx.Err())
	}

	s := &Server{
		srv:       srv,
		addr:      net.JoinHostPort(localhost, strconv.Itoa(ports.frontend)),
		namespace: opts.Namespace,
		dbPath:    dbPath,
		logs:      logs,
	}
	started = true
	if err := s.waitReady(ctx); err != nil {
		logs.setPhase(phaseStopping, true)
		_ = s.Stop()
		return nil, err
	}
	logs.setPhase(phaseRunning, false)
	return s, nil
}

// Address returns the frontend gRPC address, "127.0.0.1:PORT", to be used
// as client.Options.HostPort.
func (s *Server) Address() string { return s.addr }

// Namespace returns the namespace registered at start.
func (s *Server) Namespace() string { return s.namespace }

// Stop shuts all services down and waits for them to finish (typically 1-2
// seconds). It is safe to call more than once (and concurrently); later calls
// return the result of the first. Clients connected to the server see it as
// unavailable afterwards. The SQLite plugin keeps its connection to the file
// open until the process exits, so a later Start on the same DataDir in the
// same process reuses it.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.logs.setPhase(phaseStopping, false)
		s.stopErr = s.srv.Stop()
		if s.stopErr != nil {
			s.stopErr = fmt.Errorf("devtemporal: stop server: %w", s.stopErr)
		}
		releaseDB(s.dbPath)
	})
	return s.stopErr
}

// waitReady polls the frontend until it passes a health check and can
// describe the namespace.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()

	var lastErr error
	for {
		if lastErr = s.probe(ctx); lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devtemporal: frontend at %s did not become ready: %w (last error: %v)", s.addr, ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  s.addr,
		Namespace: s.namespace,
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return err
	}
	_, err = c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.namespace})
	return err
}

// sqliteAttributes open the file in WAL mode with synchronous=NORMAL: the
// plugin runs every service's persistence through one connection, and with
// SQLite's default rollback journal and FULL sync each commit's fsyncs
// were the dev server's ceiling (`engine load`: 36 → 66 wake-ups/s,
// docs/benchmarks.md § load). A commit still survives the process being
// killed; only an OS crash may lose the last ones, which a dev server
// accepts.
var sqliteAttributes = map[string]string{"mode": "rwc", "journal_mode": "wal", "synchronous": "normal"}

// prepareDB returns the SQLite persistence config for dbPath, creating the
// schema when the file does not exist yet and registering namespace.
//
// The same *config.SQL must be used by the server: the SQLite plugin keeps one
// process-wide connection per DSN and never closes it.
func prepareDB(dbPath, namespace string) (*config.SQL, error) {
	sqlConf := &config.SQL{
		PluginName:        sqliteplugin.PluginName,
		DatabaseName:      dbPath,
		ConnectAttributes: sqliteAttributes,
	}
	if _, err := os.Stat(dbPath); errors.Is(err, os.ErrNotExist) {
		if err := sqliteschema.SetupSchema(sqlConf); err != nil {
			return nil, fmt.Errorf("devtemporal: set up SQLite schema in %s (delete the file before retrying): %w", dbPath, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("devtemporal: stat %s: %w", dbPath, err)
	}
	nsConf, err := sqliteschema.NewNamespaceConfig(clusterName, namespace, false, nil)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: namespace %q: %w", namespace, err)
	}
	if err := sqliteschema.CreateNamespaces(sqlConf, nsConf); err != nil {
		return nil, fmt.Errorf("devtemporal: register namespace %q: %w", namespace, err)
	}
	return sqlConf, nil
}

// servicePorts are the gRPC ports of the four Temporal services.
type servicePorts struct {
	frontend, history, matching, worker int
}

// pickPorts checks that the frontend port is free (or picks one when it is 0)
// and picks distinct free ports for the internal services. All listeners are
// held open until every port is chosen so that no port is handed out twice.
func pickPorts(frontend int) (servicePorts, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	listen := func(port int) (int, error) {
		l, err := net.Listen("tcp", net.JoinHostPort(localhost, strconv.Itoa(port)))
		if err != nil {
			return 0, err
		}
		listeners = append(listeners, l)
		return l.Addr().(*net.TCPAddr).Port, nil
	}

	var (
		p   servicePorts
		err error
	)
	if p.frontend, err = listen(frontend); err != nil {
		return p, fmt.Errorf("devtemporal: frontend port %d on %s is not available (is another Temporal server running?): %w", frontend, localhost, err)
	}
	for _, dst := range []*int{&p.history, &p.matching, &p.worker} {
		if *dst, err = listen(0); err != nil {
			return p, fmt.Errorf("devtemporal: pick a free port: %w", err)
		}
	}
	return p, nil
}

// portError makes a listener failure on the frontend port (another process
// grabbed it between pickPorts and the server binding it) recognisable.
func portError(err error, frontend int) error {
	var fe *fatalError
	if errors.As(err, &fe) && strings.Contains(fe.Error(), ":"+strconv.Itoa(frontend)) {
		return fmt.Errorf("frontend port %d on %s is not available (is another Temporal server running?): %w", frontend, localhost, err)
	}
	return err
}

// buildServerOptions assembles the Temporal server configuration: SQLite
// persistence, one shard, one local cluster, static membership on 127.0.0.1.
func buildServerOptions(sqlConf *config.SQL, ports servicePorts, logger serverLogger) ([]temporal.ServerOption, error) {
	frontendAddr := net.JoinHostPort(localhost, strconv.Itoa(ports.frontend))
	service := func(port int) config.Service {
		return config.Service{RPC: config.RPC{GRPCPort: port, BindOnIP: localhost}}
	}

	conf := &config.Config{}
	conf.Global.Membership.MaxJoinDuration = 30 * time.Second
	conf.Global.Membership.BroadcastAddress = localhost
	conf.Persistence = config.Persistence{
		DefaultStore:     sqliteplugin.PluginName,
		VisibilityStore:  sqliteplugin.PluginName,
		NumHistoryShards: 1,
		DataStores:       map[string]config.DataStore{sqliteplugin.PluginName: {SQL: sqlConf}},
	}
	conf.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    false,
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {
				Enabled:                true,
				InitialFailoverVersion: 1,
				RPCAddress:             frontendAddr,
			},
		},
	}
	conf.DCRedirectionPolicy.Policy = "noop"
	conf.Services = map[string]config.Service{
		string(primitives.FrontendService): service(ports.frontend),
		string(primitives.HistoryService):  service(ports.history),
		string(primitives.MatchingService): service(ports.matching),
		string(primitives.WorkerService):   service(ports.worker),
	}
	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	// The worker service (system workflows) dials the frontend through this.
	conf.PublicClient.HostPort = frontendAddr

	authorizer, err := authorization.GetAuthorizerFromConfig(&conf.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: create authorizer: %w", err)
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&conf.Global.Authorization, logger)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: create claim mapper: %w", err)
	}

	hostPort := func(port int) static.Hosts {
		return static.SingleLocalHost(net.JoinHostPort(localhost, strconv.Itoa(port)))
	}
	dynConf := dynamicConfig()

	return []temporal.ServerOption{
		temporal.WithConfig(conf),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService: hostPort(ports.frontend),
			primitives.HistoryService:  hostPort(ports.history),
			primitives.MatchingService: hostPort(ports.matching),
			primitives.WorkerService:   hostPort(ports.worker),
		}),
		temporal.WithLogger(logger),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dynConf),
	}, nil
}

// dynamicConfig is the server's dynamic configuration.
func dynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		// Same tuning as the Temporal CLI dev server.
		dynamicconfig.HistoryCacheHostLevelMaxSize.Key():                 8096,
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,
		// Make newly added search attributes usable immediately.
		dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(): true,
		// One partition per task queue (Temporal's default is four, for
		// spreading a queue over matching hosts; here there is one host). With
		// four, a burst of workflow tasks went to the backlogs of partitions no
		// poller was on, and sat there until a poll landed on them: under
		// `engine load` every workflow stalled for 5 s to a minute at a time,
		// p99 10–56 s for a wake the engine had signalled in 0.3 s.
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
	}
}

// catchFatal runs fn and turns a *fatalError panic raised by serverLogger
// into an error. Other panics are propagated.
func catchFatal(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(*fatalError)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	return fn()
}

// The SQLite plugin shares one connection per database file across the whole
// process and never closes it. dbState tracks, per database path, whether a
// server is using it and which file the cached connection points at.
var dbState = struct {
	sync.Mutex
	inUse  map[string]bool
	opened map[string]os.FileInfo
}{inUse: map[string]bool{}, opened: map[string]os.FileInfo{}}

// claimDB marks dbPath as used by a server in this process. It fails if
// another server still uses it, or if the file was deleted or replaced since
// an earlier server in this process opened it (the plugin's cached
// connection would still point at the old file).
func claimDB(dbPath string) error {
	dbState.Lock()
	defer dbState.Unlock()
	if dbState.inUse[dbPath] {
		return fmt.Errorf("devtemporal: %s is already used by another server in this process", dbPath)
	}
	if prev, ok := dbState.opened[dbPath]; ok {
		cur, err := os.Stat(dbPath)
		if err != nil || !os.SameFile(prev, cur) {
			return fmt.Errorf("devtemporal: %s was deleted or replaced after an earlier server in this process opened it; restart the process to use the new file", dbPath)
		}
	}
	dbState.inUse[dbPath] = true
	return nil
}

// markOpened records which file the SQLite plugin's cached connection for
// dbPath points at, the first time it is opened in this process.
func markOpened(dbPath string) {
	dbState.Lock()
	defer dbState.Unlock()
	if _, ok := dbState.opened[dbPath]; !ok {
		if fi, err := os.Stat(dbPath); err == nil {
			dbState.opened[dbPath] = fi
		}
	}
}

// releaseDB undoes claimDB.
func releaseDB(dbPath string) {
	dbState.Lock()
	defer dbState.Unlock()
	delete(dbState.inUse, dbPath)
}

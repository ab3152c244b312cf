package service_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// testConfig is a service on a fresh database whose Temporal is absent:
// the client is lazy and nothing here dials it (only internal/e2e runs a
// Temporal server).
func testConfig(t *testing.T) service.Config {
	return service.Config{
		DatabaseURL:     testkit.NewDatabase(t),
		TemporalAddress: "127.0.0.1:1",
		API:             api.Config{Addr: "127.0.0.1:0", Auth: api.AuthConfig{Secrets: [][]byte{[]byte("a-test-secret-of-at-least-32-bytes!!")}}},
		Logger:          testkit.Logger(t),
	}
}

// run runs svc until the test ends, returning the API's address.
func run(t *testing.T, svc *service.Service) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, func(a net.Addr) { addr <- a.String() }) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "Run returns nil once its context ends")
		svc.Close()
	})
	select {
	case a := <-addr:
		return a
	case err := <-done:
		t.Fatalf("Run ended before the API listened: %v", err)
		return ""
	}
}

func TestRunServesTheAPIAndRunsThePool(t *testing.T) {
	ctx := context.Background()
	svc, err := service.New(ctx, testConfig(t))
	require.NoError(t, err)
	ran := make(chan struct{})
	svc.Workpool().Register("test.noop", func(context.Context, workpool.Job) (json.RawMessage, error) {
		close(ran)
		return nil, nil
	})
	addr := run(t, svc)

	res, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	_, err = svc.Workpool().Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: "test.noop", Args: json.RawMessage(`{}`)})
	require.NoError(t, err)
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the pool never ran the work: its loop was not started")
	}
}

// recordingSignaler stands in for Temporal behind the dispatcher, which
// WrapSignaler lets the caller do; it records the signals sent.
type recordingSignaler struct {
	mu   sync.Mutex
	sent []string // workflow/signal
	got  chan struct{}
}

func (r *recordingSignaler) SignalWorkflow(_ context.Context, workflowID, _, name string, _ any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, workflowID+"/"+name)
	select {
	case r.got <- struct{}{}:
	default:
	}
	return nil
}

// The parts are wired to one another: a wake-up's work runs in the pool,
// the wake-up hook queues its signal, and the dispatcher sends it through
// the Signaler the configuration wrapped around the Temporal client.
func TestAWakeupsWorkSignalsItsWorkflowThroughTheWrappedSignaler(t *testing.T) {
	ctx := context.Background()
	rec := &recordingSignaler{got: make(chan struct{}, 1)}
	var wrapped queue.Signaler
	cfg := testConfig(t)
	cfg.WrapSignaler = func(next queue.Signaler) queue.Signaler {
		wrapped = next
		return rec
	}
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, svc.Temporal(), wrapped, "the wrapper wraps the service's one Temporal client")
	svc.Workpool().Register("test.noop", func(context.Context, workpool.Job) (json.RawMessage, error) { return nil, nil })
	run(t, svc)

	_, err = svc.Mandates().Create(ctx, "o", mandates.CreateParams{AgentID: "a", Scope: "s", Budget: 10})
	require.NoError(t, err)
	_, err = svc.Wakeups().Create(ctx, wakeup.CreateParams{OrgID: "o", AgentID: "a", WorkflowID: "o/wf-1", Signal: "wake",
		Scope: "s", Reason: "test", Cost: 1, Work: wakeup.Work{Handler: "test.noop", Args: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	select {
	case <-rec.got:
	case <-time.After(30 * time.Second):
		t.Fatal("no signal was sent")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, []string{"o/wf-1/wake"}, rec.sent)
}

func TestNewRefusesAConfigWithoutADatabase(t *testing.T) {
	_, err := service.New(context.Background(), service.Config{})
	require.ErrorContains(t, err, "no database URL")
}

func TestRunFailsNamingTheAddressWhenTheAPICannotListen(t *testing.T) {
	ctx := context.Background()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	cfg := testConfig(t)
	cfg.API.Addr = taken.Addr().String()
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer svc.Close()

	err = svc.Run(ctx, func(net.Addr) { t.Error("ready called without a listener") })

	require.ErrorContains(t, err, "listen on "+taken.Addr().String())
}

// With an ops address, Run serves the probes and /metrics there too, and
// /metrics there alone; an ops address it cannot listen on fails Run,
// naming it and the variable.
func TestRunServesTheOpsAddress(t *testing.T) {
	ctx := context.Background()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	opsAddr := free.Addr().String()
	require.NoError(t, free.Close())
	cfg := testConfig(t)
	cfg.API.OpsAddr = opsAddr
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	addr := run(t, svc)
	status := func(url string) int {
		res, err := http.Get(url)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusOK, status("http://"+opsAddr+"/metrics"))
	require.Equal(t, http.StatusOK, status("http://"+opsAddr+"/readyz"))
	require.Equal(t, http.StatusNotFound, status("http://"+addr+"/metrics"))

	cfg = testConfig(t)
	cfg.API.OpsAddr = opsAddr // still taken, by the service above
	other, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer other.Close()
	err = other.Run(ctx, func(net.Addr) { t.Error("ready called without the ops listener") })
	require.ErrorContains(t, err, "listen on "+opsAddr+" (REVEILLE_OPS_ADDR)")
}

// On shutdown the signal dispatcher stops after the pool has drained: work
// that finishes during the pool's grace still has its wake signal sent by
// this replica before Run returns.
func TestShutdownSendsTheSignalsOfWorkThatFinishesDuringThePoolsDrain(t *testing.T) {
	ctx := context.Background()
	rec := &recordingSignaler{got: make(chan struct{}, 1)}
	cfg := testConfig(t)
	cfg.WrapSignaler = func(queue.Signaler) queue.Signaler { return rec }
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer svc.Close()
	started := make(chan struct{})
	svc.Workpool().Register("test.slow", func(context.Context, workpool.Job) (json.RawMessage, error) {
		close(started)
		time.Sleep(300 * time.Millisecond) // finishes within the pool's grace, after the stop began
		return nil, nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	listening := make(chan struct{})
	go func() { done <- svc.Run(runCtx, func(net.Addr) { close(listening) }) }()
	<-listening
	_, err = svc.Mandates().Create(ctx, "o", mandates.CreateParams{AgentID: "a", Scope: "s", Budget: 10})
	require.NoError(t, err)
	_, err = svc.Wakeups().Create(ctx, wakeup.CreateParams{OrgID: "o", AgentID: "a", WorkflowID: "o/wf-drain", Signal: "wake",
		Scope: "s", Reason: "test", Cost: 1, Work: wakeup.Work{Handler: "test.slow", Args: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the work never started")
	}

	stop()
	require.NoError(t, <-done)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, []string{"o/wf-drain/wake"}, rec.sent, "sent before Run returned")
}

// ShutdownGrace (REVEILLE_SHUTDOWN_GRACE) is the pool's drain: work that
// needs longer than the pool's own grace but less than ShutdownGrace
// finishes on stop instead of being handed back.
func TestShutdownGraceLetsRunningWorkFinish(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.Workpool.StopGrace = 10 * time.Millisecond // overridden by ShutdownGrace
	cfg.ShutdownGrace = 20 * time.Second
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer svc.Close()
	started, release := make(chan struct{}), make(chan struct{})
	svc.Workpool().Register("test.held", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
		close(started)
		select {
		case <-release:
			return json.RawMessage(`"done"`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	listening := make(chan struct{})
	go func() { done <- svc.Run(runCtx, func(net.Addr) { close(listening) }) }()
	<-listening
	id, err := svc.Workpool().Enqueue(ctx, workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: "test.held"})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the work never started")
	}

	stop()
	// Released well after the pool's own 10 ms grace, within ShutdownGrace.
	time.AfterFunc(500*time.Millisecond, func() { close(release) })
	require.NoError(t, <-done)

	st, err := svc.Workpool().Status(ctx, "o", id)
	require.NoError(t, err)
	require.Equal(t, workpool.StateFinished, st.State, "finished during the drain, not handed back")
	require.Equal(t, workpool.OutcomeSucceeded, st.Outcome)
}

// The retention loop is one of the service's parts, and purges the API's
// Idempotency-Key records past the API's own window (the API no longer
// runs a purge of its own).
func TestRunPurgesIdempotencyRecordsPastTheAPIsWindow(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.API.IdempotencyRetention = time.Hour
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	_, err = svc.DB().Exec(ctx, `INSERT INTO idempotency_keys (org_id, route, key, request_hash, created_at)
		VALUES ('o', 'POST /v1/x', 'past', '\x00', now() - interval '61 minutes'),
		       ('o', 'POST /v1/x', 'inside', '\x00', now() - interval '59 minutes')`)
	require.NoError(t, err)
	addr := run(t, svc)

	require.Eventually(t, func() bool {
		var left []string
		rows, err := svc.DB().Query(ctx, `SELECT key FROM idempotency_keys`)
		if err != nil {
			return false
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			_ = rows.Scan(&k)
			left = append(left, k)
		}
		return len(left) == 1 && left[0] == "inside"
	}, 30*time.Second, 10*time.Millisecond)
	res, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `reveille_retention_purged_total{table="idempotency_keys"} 1`)
}

// A schema with a migration this binary does not know (a newer binary's,
// as after a rollback) is run on, with one warning at start naming the
// versions; a schema it knows starts without it.
func TestNewWarnsOnceOfMigrationsThisBinaryDoesNotKnow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		applied string
		want    []any
	}{
		{"a known schema", "", nil},
		{"two newer versions", "(9021, true), (9022, true)", []any{9021.0, 9022.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tc.applied != "" {
				pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
				require.NoError(t, err)
				_, err = pool.Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES "+tc.applied)
				pool.Close()
				require.NoError(t, err)
			}
			var logs testkit.LogBuffer
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))

			svc, err := service.New(ctx, cfg)
			require.NoError(t, err, "an older binary on a newer schema still starts")
			svc.Close()

			var warnings []map[string]any
			for line := range strings.Lines(logs.String()) {
				var rec map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &rec))
				if strings.Contains(rec["msg"].(string), "migrations this binary does not know") {
					warnings = append(warnings, rec)
				}
			}
			if tc.want == nil {
				require.Empty(t, warnings)
				return
			}
			require.Len(t, warnings, 1)
			require.Equal(t, "WARN", warnings[0]["level"])
			require.Equal(t, tc.want, warnings[0]["unknown_versions"])
		})
	}
}

// A replica without an allow-list fails every http work item and webhook
// delivery its executor takes: the operator who started it beside others
// that have one must hear of it at start.
func TestNewWarnsThatAReplicaWithoutAnAllowListRefusesEveryHTTPRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
		warns bool
	}{
		{"no allow-list", nil, true},
		{"an allow-list", []string{"api.example.com"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.HTTPWork.AllowedHosts = tc.hosts
			var logs testkit.LogBuffer
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			svc, err := service.New(context.Background(), cfg)
			require.NoError(t, err)
			svc.Close()
			require.Equal(t, tc.warns, strings.Contains(logs.String(), `"msg":"REVEILLE_HTTP_ALLOWED_HOSTS is empty`), logs.String())
		})
	}
}

// Wake-ups that name no pool run in the "wakeup" pool, which only
// REVEILLE_POOLS creates: a start on a database without it is refused,
// naming the variable (every such wake-up was a 400 "unknown pool" naming a
// pool field the client never sent); a replica whose pools leave it out
// starts beside a database another replica's pools created it in.
func TestNewRefusesADatabaseWithoutTheWakeupsPool(t *testing.T) {
	cfg := testConfig(t)
	cfg.Workpool = workpool.Config{Pools: map[string]int{"default": 10}}
	_, err := service.New(context.Background(), cfg)
	require.ErrorContains(t, err, `REVEILLE_POOLS: the database has no pool "wakeup"`)

	cfg.Workpool = workpool.Config{Pools: map[string]int{"wakeup": 5}}
	svc, err := service.New(context.Background(), cfg)
	require.NoError(t, err)
	svc.Close()
	cfg.Workpool = workpool.Config{Pools: map[string]int{"default": 10}}
	svc, err = service.New(context.Background(), cfg)
	require.NoError(t, err, "another replica created the pool")
	svc.Close()
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
	"github.com/reveille/reveille/workpool"
)

// One Temporal server for the package (it keeps state in memory); one fresh
// database per test.
var temporalServer *temporaltest.TestServer

func TestMain(m *testing.M) {
	temporalServer = temporaltest.NewServer(temporaltest.WithBaseClientOptions(client.Options{Logger: quietTemporalLogger{}}))
	code := testkit.Run(m)
	temporalServer.Stop()
	os.Exit(code)
}

const (
	org       = "org-a"
	otherOrg  = "org-b"
	agent     = "agent-1"
	scope     = "llm"
	wait      = 30 * time.Second
	pollEvery = 10 * time.Millisecond
)

var secret = []byte("e2e-secret-e2e-secret-e2e-secret-0123456")

// stack is the engine wired as serve wires it, around one test database,
// with the Temporal client behind a TCP proxy the test controls.
type stack struct {
	t          *testing.T
	db         *pgxpool.Pool
	pool       *workpool.Manager
	mandates   *mandates.Service
	wakeups    *wakeup.Service
	approvals  *approvals.Service
	inbox      *inbox.Log
	dispatcher *queue.Dispatcher
	http       *httptest.Server
	proxy      *tcpProxy
	engineTC   client.Client // the engine's client, through the proxy
	tc         client.Client // the test's own client, direct
	taskQueue  string
	handler    *testHandlers
}

type stackOptions struct {
	notFoundGrace time.Duration
	beforeEnqueue func(ctx context.Context, id uuid.UUID) error
	pools         map[string]int
}

func newStack(t *testing.T, opts ...func(*stackOptions)) *stack {
	t.Helper()
	o := stackOptions{notFoundGrace: 30 * time.Second, pools: map[string]int{"default": 10, "wakeup": 10, "single": 1}}
	for _, f := range opts {
		f(&o)
	}
	logger := testkit.Logger(t)
	reg := prometheus.NewRegistry()
	s := &stack{t: t, db: testkit.NewPool(t), taskQueue: "e2e-" + uuid.NewString(), handler: newTestHandlers()}
	ctx := context.Background()

	var err error
	s.pool, err = workpool.New(s.db, workpool.Config{
		Pools: o.pools, RecoveryPeriod: 200 * time.Millisecond, HeartbeatTimeout: 2 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond, LeaderRetry: 200 * time.Millisecond, StopGrace: time.Second,
		HookRetryBackoff: 50 * time.Millisecond, Logger: logger, Registry: reg,
	})
	require.NoError(t, err)
	s.handler.register(s.pool)
	s.inbox = inbox.New(s.db, inbox.Config{Logger: logger})
	s.mandates = mandates.New(s.db, mandates.Config{SweepInterval: 100 * time.Millisecond, LeaderRetry: 200 * time.Millisecond, Inbox: s.inbox, Logger: logger, Registry: reg})
	s.approvals = approvals.New(s.db, approvals.Config{SweepInterval: 50 * time.Millisecond, LeaderRetry: 200 * time.Millisecond, Inbox: s.inbox, Logger: logger, Registry: reg})

	s.proxy = newTCPProxy(t, temporalServer.GetFrontendHostPort())
	s.engineTC, err = client.NewLazyClient(client.Options{HostPort: s.proxy.Addr(), Namespace: temporalServer.GetDefaultNamespace(), Logger: quietTemporalLogger{}})
	require.NoError(t, err)
	t.Cleanup(s.engineTC.Close)
	s.tc = temporalServer.GetDefaultClient()
	s.dispatcher = queue.NewDispatcher(s.db, s.engineTC, queue.DispatcherConfig{
		NotFoundGrace: o.notFoundGrace, MinBackoff: 20 * time.Millisecond, MaxBackoff: 250 * time.Millisecond,
		SendTimeout: 2 * time.Second, Logger: logger, Registry: reg,
	})
	s.wakeups = wakeup.New(s.db, s.pool, s.mandates, wakeup.Config{
		ReconcileInterval: 100 * time.Millisecond, ReconcileAfter: 200 * time.Millisecond,
		BeforeEnqueue: o.beforeEnqueue, Dispatcher: s.dispatcher, Logger: logger, Registry: reg,
	})

	w := reference.NewWorker(s.tc, s.taskQueue, s.wakeups, s.approvals)
	w.RegisterWorkflowWithOptions(awaitWakes, workflow.RegisterOptions{Name: "awaitWakes"})
	w.RegisterWorkflowWithOptions(awaitApprovals, workflow.RegisterOptions{Name: "awaitApprovals"})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	for _, c := range []interface {
		Start(context.Context) error
		Stop(context.Context) error
	}{s.inbox, s.pool, s.mandates, s.wakeups, s.approvals, s.dispatcher} {
		require.NoError(t, c.Start(ctx))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Stop(sctx)
		})
	}

	srv, err := api.New(ctx, api.Config{Auth: api.AuthConfig{Secrets: [][]byte{secret}}, Logger: logger, Registry: reg}, api.Services{
		DB: s.db, Mandates: s.mandates, Wakeups: s.wakeups, Approvals: s.approvals, Inbox: s.inbox,
		Ready: []api.ReadinessCheck{{Name: "temporal", Check: func(ctx context.Context) error {
			_, err := s.engineTC.CheckHealth(ctx, &client.CheckHealthRequest{})
			return err
		}}},
	})
	require.NoError(t, err)
	s.http = httptest.NewServer(srv.Handler())
	t.Cleanup(s.http.Close)
	return s
}

// fund gives the test agent a mandate with budget.
func (s *stack) fund(budget int64) {
	s.t.Helper()
	_, err := s.mandates.Create(context.Background(), org, mandates.CreateParams{AgentID: agent, Scope: scope, Budget: budget})
	require.NoError(s.t, err)
}

// workflowID is a fresh id in org's namespace.
func (s *stack) workflowID() string { return org + "/wf-" + uuid.NewString() }

// park starts awaitWakes for n wakes on signal and returns its run.
func (s *stack) park(id, signal string, n int, timeout time.Duration) client.WorkflowRun {
	s.t.Helper()
	run, err := s.tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: id, TaskQueue: s.taskQueue},
		"awaitWakes", awaitInput{Signal: signal, Count: n, Timeout: timeout})
	require.NoError(s.t, err)
	return run
}

// wakesOf waits for an awaitWakes run to finish and returns its wakes.
func (s *stack) wakesOf(run client.WorkflowRun) []workflows.Wake {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var wakes []workflows.Wake
	require.NoError(s.t, run.Get(ctx, &wakes))
	return wakes
}

type awaitInput struct {
	Signal  string
	Count   int
	Timeout time.Duration
}

// awaitWakes is a test workflow: it awaits Count wakes on Signal (with
// dedupe) and returns them; a timeout returns what it got so far with the
// error.
func awaitWakes(ctx workflow.Context, in awaitInput) ([]workflows.Wake, error) {
	ctx = workflows.WithWakeDedupe(ctx)
	var wakes []workflows.Wake
	for range in.Count {
		w, err := workflows.AwaitWake(ctx, in.Signal, in.Timeout)
		if err != nil {
			return wakes, err
		}
		wakes = append(wakes, w)
	}
	return wakes, nil
}

// token signs a token for org with roles (and sub = "user-"+roles[0]).
func token(t *testing.T, orgID string, roles ...string) string {
	t.Helper()
	tok, err := api.SignToken(secret, api.TokenSpec{OrgID: orgID, Sub: "user-" + strings.Join(roles, "-"), Roles: roles, TTL: time.Hour})
	require.NoError(t, err)
	return tok
}

type resp struct {
	status int
	body   map[string]any
	raw    []byte
}

func (s *stack) call(method, path, tok string, body any, headers ...string) resp {
	s.t.Helper()
	var rdr io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(s.t, err)
		rdr = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.http.URL+path, rdr)
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(s.t, err)
	r := resp{status: res.StatusCode, raw: raw}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

// wakeupBody is a valid POST /v1/wakeups body running handler with args.
func wakeupBody(workflowID, handler string, args any) map[string]any {
	return map[string]any{
		"agent_id": agent, "workflow_id": workflowID, "signal": "wake", "scope": scope, "reason": "test", "cost": 1,
		"work": map[string]any{"handler": handler, "args": args},
	}
}

// createWakeup posts a wake-up and requires 201; it returns the id.
func (s *stack) createWakeup(body map[string]any) string {
	s.t.Helper()
	r := s.call(http.MethodPost, "/v1/wakeups", token(s.t, org, "agent"), body)
	require.Equal(s.t, http.StatusCreated, r.status, string(r.raw))
	return r.body["id"].(string)
}

func (s *stack) getWakeup(id string) map[string]any {
	s.t.Helper()
	r := s.call(http.MethodGet, "/v1/wakeups/"+id, token(s.t, org, "admin"), nil)
	require.Equal(s.t, http.StatusOK, r.status, string(r.raw))
	return r.body
}

// eventually waits for the wake-up to satisfy cond.
func (s *stack) eventually(id string, what string, cond func(w map[string]any) bool) map[string]any {
	s.t.Helper()
	var last map[string]any
	ok := assertEventually(func() bool { last = s.getWakeup(id); return cond(last) })
	require.True(s.t, ok, "wake-up never %s; last: %v", what, last)
	return last
}

func assertEventually(cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(pollEvery)
	}
	return cond()
}

func delivery(w map[string]any) map[string]any { return w["delivery"].(map[string]any) }

// spent is the test agent's mandate's spent and the ledger's sum.
func (s *stack) spent() (spent, ledger int64) {
	s.t.Helper()
	err := s.db.QueryRow(context.Background(), `
		SELECT m.spent, coalesce((SELECT sum(amount) FROM mandate_ledger l WHERE l.mandate_id = m.id), 0)
		  FROM mandates m WHERE org_id = $1 AND agent_id = $2 AND scope = $3`, org, agent, scope).Scan(&spent, &ledger)
	require.NoError(s.t, err)
	return spent, ledger
}

func (s *stack) count(sql string, args ...any) int {
	s.t.Helper()
	var n int
	require.NoError(s.t, s.db.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// testHandlers are the work handlers the tests run.
type testHandlers struct {
	started chan string // args "tag" of block handlers as they start
	release chan struct{}
	calls   atomic.Int64
}

func newTestHandlers() *testHandlers {
	return &testHandlers{started: make(chan string, 100), release: make(chan struct{})}
}

func (h *testHandlers) register(p *workpool.Manager) {
	// echo returns its args.
	p.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) {
		h.calls.Add(1)
		return j.Args, nil
	})
	// fail always fails (retryably), naming the attempt.
	p.Register("fail", func(_ context.Context, j workpool.Job) (json.RawMessage, error) {
		h.calls.Add(1)
		return nil, fmt.Errorf("boom on attempt %d", j.Attempt)
	})
	// block runs until released or canceled.
	p.Register("block", func(ctx context.Context, j workpool.Job) (json.RawMessage, error) {
		h.calls.Add(1)
		var args struct{ Tag string }
		_ = json.Unmarshal(j.Args, &args)
		h.started <- args.Tag
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-h.release:
			return json.RawMessage(`"released"`), nil
		}
	})
}

// quietTemporalLogger drops the SDK's logs (a cut proxy makes it chatty).
type quietTemporalLogger struct{}

func (quietTemporalLogger) Debug(string, ...any) {}
func (quietTemporalLogger) Info(string, ...any)  {}
func (quietTemporalLogger) Warn(string, ...any)  {}
func (quietTemporalLogger) Error(string, ...any) {}

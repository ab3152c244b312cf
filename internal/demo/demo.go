// Package demo runs the reference workflow through an engine's REST API
// and Temporal — a success, a failure, a cancel, a tool call approved and
// one denied by a human, and a refused spend approved — printing each
// one's timeline (`engine demo`). It is a client of the engine: it talks
// to a running one, or to one its caller starts in the same process, and
// to its REST API only through the Go client (package client), as an
// agent platform would.
package demo

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/devstack/localstack"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
	"github.com/reveille/reveille/workpool"
)

const (
	demoScope = "demo"
)

// Config is what the demo needs to know of the engine it runs against.
type Config struct {
	// APIURL is the engine's API. When nothing answers there, StartEngine
	// starts one.
	APIURL string
	// TemporalAddress and Namespace are the engine's Temporal (default
	// service.DefaultTemporalAddress).
	TemporalAddress, Namespace string
	// Org is the org of the demo's tokens.
	Org string
	// Secret signs the demo's tokens; empty, the dev secret in DataDir does.
	Secret, DataDir string
	// Issuer and Audience go into the demo's tokens when the engine
	// requires them.
	Issuer, Audience string
	// StartEngine starts an engine in this process, for as long as ctx
	// lasts, and says where it is.
	StartEngine func(ctx context.Context) (Engine, error)
	// Logger receives the Temporal client's errors (default: discarded).
	Logger *slog.Logger
}

// Engine is where an engine StartEngine started runs.
type Engine struct {
	APIURL, TemporalAddress, Secret string
}

// Run runs the six cases, each to its workflow's end, and prints their
// timelines.
func Run(ctx context.Context, c Config) error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if _, err := reveille.New(c.APIURL); err != nil {
		return fmt.Errorf("--api / REVEILLE_API_URL: %w", err)
	}
	if !answers(c.APIURL) {
		fmt.Printf("no engine answers at %s: starting one (engine dev) in this process…\n", c.APIURL)
		e, err := c.StartEngine(ctx)
		if err != nil {
			return err
		}
		c.APIURL, c.TemporalAddress, c.Secret = e.APIURL, e.TemporalAddress, cmp.Or(c.Secret, e.Secret)
	}
	if c.TemporalAddress == "" {
		c.TemporalAddress = service.DefaultTemporalAddress
	}
	secret := c.Secret
	if secret == "" {
		secret, _ = localstack.ReadDevSecret(c.DataDir)
	}
	if secret == "" {
		return fmt.Errorf("no REVEILLE_JWT_SECRET and no dev secret in %s: point --data-dir at the engine's data dir", c.DataDir)
	}
	apis, err := newDemoAPIs(c.APIURL, []byte(secret), c.Org, c.Issuer, c.Audience)
	if err != nil {
		return err
	}
	tc, err := client.Dial(client.Options{HostPort: c.TemporalAddress, Namespace: c.Namespace, Logger: service.TemporalLogger(c.Logger)})
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s (TEMPORAL_ADDRESS): %w", c.TemporalAddress, err)
	}
	defer tc.Close()
	if err := AwaitWorker(ctx, tc, workflows.TaskQueue, workerWait); err != nil {
		return err
	}

	target := newDemoTarget()
	defer target.Close()
	// A fresh agent per run: the refused-then-approved case overruns its
	// mandate, which would refuse the spends of every later case and run.
	d := &demo{demoAPIs: apis, tc: tc, target: target, agent: "demo-agent-" + uuid.NewString()[:8], org: c.Org}
	if err := d.ensureMandate(ctx); err != nil {
		return err
	}
	for _, c := range demoCases {
		if err := d.run(ctx, c); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// workerWait is how long the demo waits for a worker on the engine's task
// queue (one starting beside it) before it says none runs.
const workerWait = 10 * time.Second

// AwaitWorker returns once a worker polls taskQueue for workflow tasks,
// and an error naming the cause when none does within wait: without one
// the demo's workflows sat in the queue for each case's two minutes,
// printing nothing, before the first case failed.
func AwaitWorker(ctx context.Context, tc client.Client, taskQueue string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		res, err := tc.DescribeTaskQueue(ctx, taskQueue, enums.TASK_QUEUE_TYPE_WORKFLOW)
		if err == nil && len(res.GetPollers()) > 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("ask Temporal for the workers of task queue %q: %w", taskQueue, err)
			}
			return fmt.Errorf("no worker polls task queue %q (waited %s): run the engine with its Temporal worker — engine dev does; engine serve needs --worker (REVEILLE_WORKER=true)",
				taskQueue, wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// demoCases are the runs of the demo, in order.
var demoCases = []demoCase{
	{name: "success", path: "/ok", cost: 1},
	{name: "failure", path: "/fail", cost: 1, retry: true},
	{name: "cancel", path: "/slow", cost: 1, cancel: true},
	{name: "tool call approved by a human", path: "/ok", cost: 1, tool: "approved"},
	{name: "tool call denied by a human", path: "/ok", cost: 1, tool: "denied"},
	{name: "refused, then approved", path: "/ok", cost: 1_000_000, approve: true},
}

// CaseNames are the demo's runs, in order: what engine demo's description
// must list.
func CaseNames() []string {
	names := make([]string, len(demoCases))
	for i, c := range demoCases {
		names[i] = c.name
	}
	return names
}

// answers reports whether an engine's API answers at apiURL now: one
// attempt, no retries, within a second.
func answers(apiURL string) bool {
	probe, err := reveille.New(apiURL, reveille.WithRetry(reveille.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return probe.Healthz(ctx) == nil
}

type demoCase struct {
	name, path             string
	cost                   int64
	retry, cancel, approve bool
	// tool, when set, gives the workflow a tool call that a human answers
	// with this decision (approved or denied) through the REST endpoint.
	tool string
}

type demo struct {
	demoAPIs
	agent  string
	org    string // of every token and workflow id
	tc     client.Client
	target *demoTarget
}

// demoAPIs is the engine's API as each of the demo's roles.
type demoAPIs struct {
	// admin creates the mandate; agentRuntime (agent and admin) reads and
	// cancels the workflows' wake-ups; approver is the human who answers
	// approval requests.
	admin, agentRuntime, approver *reveille.Client
}

// newDemoAPIs makes a client per role, on one connection pool, with
// tokens of org signed by secret; issuer and audience go into them when
// the engine requires them (REVEILLE_JWT_ISSUER, REVEILLE_JWT_AUDIENCE).
// A token lasts an hour, longer than the six cases' bound of two minutes
// each.
func newDemoAPIs(apiURL string, secret []byte, org, issuer, audience string) (demoAPIs, error) {
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	as := func(sub string, roles ...string) (*reveille.Client, error) {
		tok, err := api.SignToken(secret, api.TokenSpec{OrgID: org, Sub: sub, Roles: roles, TTL: time.Hour, Issuer: issuer, Audience: audience})
		if err != nil {
			return nil, fmt.Errorf("sign the demo's %s token: %w", sub, err)
		}
		return reveille.New(apiURL, reveille.WithToken(tok), reveille.WithHTTPClient(hc), reveille.WithUserAgent("reveille-engine-demo"))
	}
	var apis demoAPIs
	var err error
	if apis.admin, err = as("demo-admin", api.RoleAdmin); err != nil {
		return apis, err
	}
	if apis.agentRuntime, err = as("demo-agent-runtime", api.RoleAgent, api.RoleAdmin); err != nil {
		return apis, err
	}
	apis.approver, err = as("demo-approver", api.RoleApprover)
	return apis, err
}

type event struct {
	at   time.Time
	what string
}

// ensureMandate gives the demo agent a budget of 1000 (a refusal needs more).
func (d *demo) ensureMandate(ctx context.Context) error {
	_, err := d.admin.Mandates.Create(ctx, reveille.MandateCreate{AgentID: d.agent, Scope: demoScope, Budget: 1000})
	if err != nil && !reveille.IsConflict(err) {
		return fmt.Errorf("create the demo mandate: %w", err)
	}
	return nil
}

func (d *demo) run(ctx context.Context, c demoCase) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d.target.reset()
	wf := d.org + "/demo-" + strings.ReplaceAll(strings.Fields(c.name)[0], ",", "") + "-" + uuid.NewString()[:8]
	in := reference.Input{AgentID: d.agent, Signal: "wake", Scope: demoScope, Reason: "demo: " + c.name, Cost: c.cost,
		Work: wakeup.Work{Handler: "http", Args: mustJSON(map[string]any{"url": d.target.url + c.path})}, Timeout: time.Minute}
	if c.retry {
		in.Work.Retry = &workpoolRetry
	}
	if c.tool != "" {
		in.Tool = &reference.ToolStep{ToolName: "deploy", Input: mustJSON(map[string]any{"env": "staging"}), Timeout: time.Minute}
	}
	start := time.Now()
	events := []event{{start, "workflow started  " + wf}}
	run, err := d.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: wf, TaskQueue: workflows.TaskQueue}, reference.WorkflowName, in)
	if err != nil {
		return fmt.Errorf("start the reference workflow: %w", err)
	}
	if c.tool != "" {
		evs, err := d.answerToolCall(ctx, wf, c.tool)
		if err != nil {
			return err
		}
		events = append(events, evs...)
	}
	var wakeupID string
	if c.tool != "denied" {
		if wakeupID, err = d.awaitWakeup(ctx, wf); err != nil {
			return err
		}
	}
	switch {
	case c.approve:
		w, err := d.agentRuntime.Wakeups.Get(ctx, wakeupID)
		if err != nil {
			return fmt.Errorf("read wake-up: %w", err)
		}
		if w.Approval == nil {
			return errors.New("expected a refused spend with an approval request")
		}
		events = append(events, event{w.CreatedAt, fmt.Sprintf("spend of %d refused → approval request %v (workflow parks)", c.cost, w.Approval.ID)})
		time.Sleep(300 * time.Millisecond) // a human takes a moment
		approvedAt := time.Now()
		if _, err := d.approver.MandateApprovals.Approve(ctx, w.Approval.ID, reveille.Resolution{Note: "approved by engine demo"}); err != nil {
			return fmt.Errorf("approve: %w", err)
		}
		events = append(events, event{approvedAt, "approved by a human → work enqueued in the same transaction"})
	case c.cancel:
		select {
		case <-d.target.started:
		case <-ctx.Done():
			return ctx.Err()
		}
		canceledAt := time.Now()
		if _, err := d.agentRuntime.Wakeups.Cancel(ctx, wakeupID); err != nil {
			return fmt.Errorf("cancel: %w", err)
		}
		events = append(events, event{canceledAt, "POST /v1/wakeups/{id}/cancel"})
	}
	var res reference.Result
	if err := run.Get(ctx, &res); err != nil {
		return fmt.Errorf("reference workflow: %w", err)
	}
	doneAt := time.Now()
	events = append(events, d.target.events()...)
	events = append(events, d.historyEvents(ctx, wf, run.GetRunID(), c.tool != "")...)
	if wakeupID != "" && !c.approve {
		// The read only adds a moment to the timeline, which goes
		// without it when the read fails.
		if w, err := d.agentRuntime.Wakeups.Get(ctx, wakeupID); err == nil && !w.CreatedAt.IsZero() {
			events = append(events, event{w.CreatedAt, "wake-up enqueued  " + wakeupID + fmt.Sprintf(" (mandate debited %d)", c.cost)})
		}
	}
	detail := "outcome=" + res.Outcome
	if len(res.Wake.Result) > 0 {
		detail += " result=" + truncate(string(res.Wake.Result), 80)
	}
	if res.Wake.Error != "" {
		detail += " error=" + truncate(res.Wake.Error, 80)
	}
	events = append(events, event{doneAt, "workflow returned  " + detail})
	sort.SliceStable(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
	fmt.Printf("\n%s\n", c.name)
	for _, e := range events {
		fmt.Printf("  %+7.1fms  %s\n", float64(e.at.Sub(start).Microseconds())/1000, e.what)
	}
	return nil
}

var workpoolRetry = wakeupRetry()

// awaitWakeup finds the wake-up the workflow's activity created. An error
// the client did not overcome by its retries ends the wait.
func (d *demo) awaitWakeup(ctx context.Context, wf string) (string, error) {
	for {
		page, err := d.agentRuntime.Wakeups.ListPage(ctx, reveille.WakeupListParams{WorkflowID: wf, PageParams: reveille.PageParams{Limit: 1}})
		if err != nil && ctx.Err() == nil {
			return "", fmt.Errorf("list the workflow's wake-ups: %w", err)
		}
		if len(page.Items) > 0 {
			return page.Items[0].ID, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the workflow's wake-up never appeared (is the engine's Temporal worker running? engine dev runs it): %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// answerToolCall waits for the workflow's pending tool call in the inbox
// and answers it as a human would, through POST
// /v1/sessions/{session_id}/tool-approvals (the session is the workflow id).
func (d *demo) answerToolCall(ctx context.Context, wf, decision string) ([]event, error) {
	var approval *reveille.ToolApproval
	for approval == nil {
		page, err := d.approver.ToolApprovals.ListPage(ctx, reveille.ToolApprovalListParams{Status: "pending", SessionID: wf, PageParams: reveille.PageParams{Limit: 1}})
		if err != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("read the inbox: %w", err)
		}
		if len(page.Items) > 0 {
			approval = &page.Items[0]
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the workflow's tool call never appeared in the inbox (is the engine's Temporal worker running?): %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	events := []event{{approval.CreatedAt, fmt.Sprintf("tool call %q pending → approval %v in the inbox (no policy decided)", approval.ToolName, approval.ID)}}
	time.Sleep(300 * time.Millisecond) // a human takes a moment
	answeredAt := time.Now()
	_, err := d.approver.ToolApprovals.Respond(ctx, wf, reveille.ToolCallResponse{ApprovalID: approval.ID, Decision: decision, Note: "answered by engine demo"})
	if err != nil {
		return nil, fmt.Errorf("answer the tool call: %w", err)
	}
	events = append(events, event{answeredAt, "POST /v1/sessions/{id}/tool-approvals  decision=" + decision + " → signal queued in the same transaction"})
	return events, nil
}

// historyEvents reads the moments the workflow parked and woke from its
// Temporal history; withTool: its first activity asked for a tool call and
// its first signal carried the decision.
func (d *demo) historyEvents(ctx context.Context, wf, runID string, withTool bool) []event {
	var out []event
	toolAsked, toolAnswered := !withTool, !withTool
	it := d.tc.GetWorkflowHistory(ctx, wf, runID, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			break
		}
		at := e.GetEventTime().AsTime()
		switch e.GetEventType() {
		case enums.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			if !toolAsked {
				toolAsked = true
				out = append(out, event{at, `tool call requested → workflow parked on signal "approval" (AwaitApproval)`})
				continue
			}
			out = append(out, event{at, `workflow parked on signal "wake" (AwaitWake)`})
		case enums.EVENT_TYPE_ACTIVITY_TASK_FAILED:
			out = append(out, event{at, `enqueue activity refused (non-retryable) → workflow parks on "wake"`})
		case enums.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
			if !toolAnswered {
				toolAnswered = true
				out = append(out, event{at, "approval signal received: workflow woke with the decision"})
				continue
			}
			out = append(out, event{at, "signal received: workflow woke"})
		}
	}
	return out
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// demoTarget is the local HTTP service the demo's work calls.
type demoTarget struct {
	srv     *http.Server
	url     string
	mu      sync.Mutex
	log     []event
	started chan struct{}
}

func newDemoTarget() *demoTarget {
	t := &demoTarget{started: make(chan struct{}, 10)}
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		t.record("work started  (http handler: GET /ok)")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"greeting":"hello from the demo target"}`))
		t.record("work done  (200)")
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		t.record("work attempt  (http handler: GET /fail → 503, retryable)")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		t.record("work started  (http handler: GET /slow, runs until canceled)")
		t.started <- struct{}{}
		select {
		case <-r.Context().Done():
			t.record("work canceled  (the handler's context was canceled)")
		case <-time.After(time.Minute):
		}
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	t.url = "http://" + ln.Addr().String()
	t.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = t.srv.Serve(ln) }()
	return t
}

func (t *demoTarget) record(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = append(t.log, event{time.Now(), what})
}

func (t *demoTarget) events() []event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]event(nil), t.log...)
}

func (t *demoTarget) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = nil
}

func (t *demoTarget) Close() { _ = t.srv.Close() }

func wakeupRetry() workpool.RetryPolicy {
	return workpool.RetryPolicy{MaxAttempts: 3, InitialBackoffMS: 50, Base: 2}
}

// Package load is `engine load`: it drives a running engine's REST API as
// an agent platform would — a mandate, then wake-ups, some refused by the
// budget and approved by a human, some canceled, some behind a tool call a
// human approves — through the Go client only (package client), with a
// Temporal worker of its own whose workflows park on the signals through
// workflows.AwaitWake and AwaitApproval. It measures, in that worker's
// process, how long each wake-up took from the request that settled it to
// its workflow waking, and counts every wake-up whose workflow never woke
// as lost.
package load

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
)

// Config is a load run. The counts and durations are taken as given, a
// zero too (engine load's flags hold their defaults): a zero there is
// refused, naming the flag, not read as "the default". The other fields'
// zero values take the defaults noted.
type Config struct {
	// APIs are the engine's API base URLs (at least one). Clients are
	// spread over them, and a call whose replica does not answer goes to
	// the next one, under the same idempotency key.
	APIs []string
	// Token acts as the agent platform: agent (wake-ups, tool calls,
	// cancels) and admin (the mandate) of its org. Empty: one like `engine
	// dev`'s is signed with Secret for Org.
	Token string
	// ApproverToken is the human who approves refused spends and tool
	// calls: approver of the same org, another sub than Token's (nobody
	// approves their own request). Empty: one is signed with Secret.
	ApproverToken string
	// Secret signs the tokens not given; Issuer and Audience go into them.
	Secret, Issuer, Audience string
	// Org is the org of a token signed here (default "dev-org").
	Org string
	// TemporalAddress and Namespace are the engine's Temporal (default
	// service.DefaultTemporalAddress, "default").
	TemporalAddress, Namespace string

	// Wakeups is how many wake-ups to ask for (at least 1; engine load's
	// default 20000), by Clients concurrent clients (at least 1; default 64),
	// each asking for its next wake-up once its last one woke (or its
	// deadline passed).
	Wakeups, Clients int
	// ApprovalsEvery: every so many wake-ups, the workflow first asks for
	// a tool call that the approver approves (0: none).
	ApprovalsEvery int
	// RefuseEvery: every so many wake-ups are refused by the budget (402)
	// and approved by the approver (at least 1, or negative: none; engine
	// load's default 20).
	RefuseEvery int
	// CancelEvery: every so many wake-ups run work that holds until the
	// wake-up is canceled, which the client does at once (at least 1, or
	// negative: none; engine load's default 20).
	CancelEvery int
	// Deadline is how long a wake-up may take, from the request that
	// settled it to its workflow waking, before it counts as lost
	// (at least 1s; engine load's default 2 min: longer than the default
	// heartbeat timeout and recovery period together, which bound a killed
	// replica's work).
	Deadline time.Duration
	// Progress is how often a progress line is printed (at least 1s;
	// engine load's default 5 s).
	Progress time.Duration
	// TargetAddr is where the HTTP service the wake-ups' work calls
	// listens (default 127.0.0.1:0): the engine must be allowed to call
	// it (REVEILLE_HTTP_ALLOWED_HOSTS; `engine dev` allows any local port).
	TargetAddr string
	// Out receives the progress and the result (default os.Stdout).
	Out io.Writer
	// Logger receives the Temporal SDK's logs and the first errors
	// (default: errors only, on stderr).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.Org = cmp.Or(c.Org, "dev-org")
	c.TemporalAddress = cmp.Or(c.TemporalAddress, service.DefaultTemporalAddress)
	c.Namespace = cmp.Or(c.Namespace, "default")
	c.TargetAddr = cmp.Or(c.TargetAddr, "127.0.0.1:0")
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if len(c.APIs) == 0 {
		errs = append(errs, errors.New("--api: at least one API URL is needed"))
	}
	if c.Wakeups < 1 {
		errs = append(errs, errors.New("--wakeups: must be at least 1"))
	}
	if c.Clients < 1 {
		errs = append(errs, errors.New("--clients: must be at least 1"))
	}
	if c.ApprovalsEvery < 0 {
		errs = append(errs, errors.New("--approvals-every: must be 0 (none) or more"))
	}
	if c.RefuseEvery == 0 {
		errs = append(errs, errors.New("--refuse-every: must be at least 1 (or -1: none)"))
	}
	if c.CancelEvery == 0 {
		errs = append(errs, errors.New("--cancel-every: must be at least 1 (or -1: none)"))
	}
	// At least a second each: --progress 1ms printed progress lines back to
	// back, and a wake-up cannot wake its workflow within a millisecond.
	if c.Deadline < time.Second {
		errs = append(errs, fmt.Errorf("--deadline: must be at least 1s, not %s", c.Deadline))
	}
	if c.Progress < time.Second {
		errs = append(errs, fmt.Errorf("--progress: must be at least 1s, not %s", c.Progress))
	}
	return errors.Join(errs...)
}

// Report is a run's result.
type Report struct {
	// Wakeups were asked for; Accepted of them had the request that
	// settles them (create, approve or cancel) accepted; Woken of those
	// woke their workflow, Lost did not within the deadline (and
	// Interrupted were still within it when the run was interrupted).
	Wakeups, Accepted, Woken, Lost int
	// Refused, Canceled and ToolCalls count the accepted wake-ups of each
	// kind (the rest were funded at once).
	Refused, Canceled, ToolCalls int
	// Interrupted were still within their deadline when the run was
	// interrupted: neither woken nor lost.
	Interrupted int
	// WrongOutcomes woke with another outcome (or decision) than theirs.
	WrongOutcomes int
	// Duplicates are repeated deliveries the workflows ignored.
	Duplicates int
	// Errors are wake-ups whose requests failed for good (after the
	// client's retries and the other APIs): never accepted, not counted
	// as lost.
	Errors int
	// P50 and P99 are the latency from the settling request's answer to
	// the workflow waking, over the woken.
	P50, P99, Max time.Duration
	Elapsed       time.Duration
}

// Line is the report's one-line summary.
func (r Report) Line() string {
	return fmt.Sprintf("load: wakeups=%d woken=%d lost=%d duplicates_deduped=%d p50=%.1fms p99=%.1fms errors=%d",
		r.Wakeups, r.Woken, r.Lost, r.Duplicates, ms(r.P50), ms(r.P99), r.Errors)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ErrLost is returned by Run when a wake-up did not wake its workflow in
// time, or woke it with the wrong outcome.
var ErrLost = errors.New("load: wake-ups lost")

// ErrRequestsFailed is returned by Run when some wake-up's requests failed
// for good (after the client's retries and the other APIs), so it was never
// accepted.
var ErrRequestsFailed = errors.New("load: requests failed")

// Run drives the load until every wake-up was asked for and every accepted
// one woke or passed its deadline, prints the result, and returns it;
// ErrLost (wrapped) when any was lost or woke wrongly, ErrRequestsFailed
// (wrapped) when any was never accepted.
func Run(ctx context.Context, c Config) (Report, error) {
	// Validated as given, before the defaults: a count given as 0 is
	// refused, not run as a default.
	if err := c.validate(); err != nil {
		return Report{}, err
	}
	c = c.withDefaults()
	r, err := newRun(ctx, c)
	if err != nil {
		return Report{}, err
	}
	defer r.close()
	// The run's id finds its workflows in Temporal and its wake-ups in the
	// engine, to look into a slow one.
	fmt.Fprintf(c.Out, "load: run=%s workflows=%s/load-%s-<i> task_queue=%s\n", r.id, r.org, r.id, r.taskQueue())
	rep := r.drive(ctx)
	fmt.Fprintln(c.Out, rep.Line())
	fmt.Fprintf(c.Out, "load: accepted=%d refused_then_approved=%d canceled=%d tool_calls=%d wrong_outcomes=%d interrupted=%d max=%.1fms elapsed=%s rate=%.0f/s\n",
		rep.Accepted, rep.Refused, rep.Canceled, rep.ToolCalls, rep.WrongOutcomes, rep.Interrupted, ms(rep.Max), rep.Elapsed.Round(time.Millisecond),
		float64(rep.Accepted)/rep.Elapsed.Seconds())
	if err := rep.verdict(c.Deadline); err != nil {
		return rep, err
	}
	return rep, ctx.Err()
}

// verdict is the run's failure, if any: wake-ups lost or woken wrongly
// (ErrLost), and wake-ups whose requests failed for good
// (ErrRequestsFailed) — the engine refused or never answered what a
// platform asked, which a load test must not pass over either.
func (rep Report) verdict(deadline time.Duration) error {
	var errs []error
	if rep.Lost > 0 || rep.WrongOutcomes > 0 {
		errs = append(errs, fmt.Errorf("%w: %d never woke within %s, %d woke with the wrong outcome", ErrLost, rep.Lost, deadline, rep.WrongOutcomes))
	}
	if rep.Errors > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of %d wake-ups were never accepted (the first errors are logged)", ErrRequestsFailed, rep.Errors, rep.Wakeups))
	}
	return errors.Join(errs...)
}

// run is one load run's parts.
type run struct {
	cfg      Config
	id       string // in every workflow id and idempotency key of the run
	org      string
	agent    string
	apis     []apiPair
	tc       client.Client
	worker   worker.Worker
	target   *target
	recorder *recorder
	errs     atomic.Int64
	logged   atomic.Int64
}

// apiPair is one API as the agent platform and as the approver.
type apiPair struct{ agent, approver *reveille.Client }

const (
	scopeFunded  = "load"
	scopeRefused = "load-overrun" // budget 0: every spend is refused
	toolName     = "deploy"
)

func newRun(ctx context.Context, c Config) (*run, error) {
	r := &run{cfg: c, id: uuid.NewString()[:8], recorder: newRecorder()}
	if err := r.connectAPIs(ctx); err != nil {
		return nil, err
	}
	r.agent = "load-agent-" + r.id
	var err error
	if r.target, err = newTarget(c.TargetAddr); err != nil {
		return nil, err
	}
	r.tc, err = client.Dial(client.Options{HostPort: c.TemporalAddress, Namespace: c.Namespace, Logger: service.TemporalLogger(c.Logger)})
	if err != nil {
		r.target.Close()
		return nil, fmt.Errorf("connect to Temporal at %s: %w", c.TemporalAddress, err)
	}
	// Sixteen workflow-task pollers: every load workflow's one workflow
	// task waits in the queue until polled, and the SDK's two (split
	// between the sticky and the normal queue) took about 50 tasks/s from
	// `engine dev`, 16 about 66/s (docs/benchmarks.md § load).
	r.worker = worker.New(r.tc, r.taskQueue(), worker.Options{MaxConcurrentWorkflowTaskPollers: 16})
	r.worker.RegisterWorkflowWithOptions(parkedWorkflow(r.recorder.woke), workflow.RegisterOptions{Name: WorkflowName})
	if err := r.worker.Start(); err != nil {
		r.close()
		return nil, fmt.Errorf("start the load's Temporal worker: %w", err)
	}
	if err := r.createMandates(ctx); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// taskQueue is the run's own: its worker is the only one polling it.
func (r *run) taskQueue() string { return "reveille-load-" + r.id }

func (r *run) close() {
	if r.worker != nil {
		r.worker.Stop()
	}
	if r.tc != nil {
		r.tc.Close()
	}
	r.target.Close()
}

// connectAPIs makes the clients and checks the tokens: the agent
// platform's must be agent and admin, the approver's approver of the same
// org under another sub.
func (r *run) connectAPIs(ctx context.Context) error {
	c := r.cfg
	// One connection pool for every client: 64 clients would otherwise
	// open and close connections past the default two idle ones per host.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * c.Clients
	hc := &http.Client{Transport: tr}
	mk := func(url, tok string) (*reveille.Client, error) {
		return reveille.New(url, reveille.WithToken(tok), reveille.WithHTTPClient(hc), reveille.WithUserAgent("reveille-engine-load"))
	}
	sign := func(org, sub string, roles ...string) (string, error) {
		if c.Secret == "" {
			return "", fmt.Errorf("no token for the %s and no secret to sign one: pass it, or REVEILLE_JWT_SECRET / --data-dir of the engine", sub)
		}
		return api.SignToken([]byte(c.Secret), api.TokenSpec{OrgID: org, Sub: sub, Roles: roles, TTL: 24 * time.Hour, Issuer: c.Issuer, Audience: c.Audience})
	}
	tok := c.Token
	if tok == "" {
		var err error
		// As `engine dev`'s token: every role, sub dev-user.
		if tok, err = sign(c.Org, "dev-user", api.AllRoles...); err != nil {
			return err
		}
	}
	for _, url := range c.APIs {
		agent, err := mk(url, tok)
		if err != nil {
			return err
		}
		r.apis = append(r.apis, apiPair{agent: agent})
	}
	// (checked as every call goes: a replica that does not answer is
	// passed over for the next, as it would be mid-run)
	var me reveille.Principal
	err := r.call(ctx, 0, func(p apiPair) (err error) {
		me, err = p.agent.Whoami(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("the agent platform's token: %w", err)
	}
	if !slices.Contains(me.Roles, api.RoleAgent) || !slices.Contains(me.Roles, api.RoleAdmin) {
		return fmt.Errorf("--token: needs the agent and admin roles of its org, has %v", me.Roles)
	}
	r.org = me.OrgID
	approverTok := c.ApproverToken
	if approverTok == "" {
		if approverTok, err = sign(r.org, "dev-approver", api.RoleApprover); err != nil {
			return err
		}
	}
	for i, url := range c.APIs {
		if r.apis[i].approver, err = mk(url, approverTok); err != nil {
			return err
		}
	}
	var approver reveille.Principal
	err = r.call(ctx, 0, func(p apiPair) (err error) {
		approver, err = p.approver.Whoami(ctx)
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("the approver's token: %w", err)
	case approver.OrgID != r.org || !slices.Contains(approver.Roles, api.RoleApprover):
		return fmt.Errorf("--approver-token: needs the approver role of org %s, is %v of %s", r.org, approver.Roles, approver.OrgID)
	case approver.Sub == me.Sub:
		return fmt.Errorf("--approver-token: its sub %q is the agent platform's, and nobody approves their own request", me.Sub)
	}
	return nil
}

// createMandates gives the run's agent a budget covering every funded
// wake-up, and a budget of 0 in the scope the refused ones spend from.
func (r *run) createMandates(ctx context.Context) error {
	for _, m := range []reveille.MandateCreate{
		{AgentID: r.agent, Scope: scopeFunded, Budget: int64(r.cfg.Wakeups)},
		{AgentID: r.agent, Scope: scopeRefused, Budget: 0},
	} {
		err := r.call(ctx, 0, func(p apiPair) error {
			_, err := p.agent.Mandates.Create(ctx, m, reveille.WithIdempotencyKey(r.id+"-mandate-"+m.Scope))
			return err
		})
		if err != nil {
			return fmt.Errorf("create the load's mandate for %s: %w", m.Scope, err)
		}
	}
	return nil
}

// call runs f against the APIs in turn, from the i-th, until one answers
// (an answer that is an error is returned as it is).
func (r *run) call(ctx context.Context, i int, f func(apiPair) error) error {
	var err error
	for k := range r.apis {
		err = f(r.apis[(i+k)%len(r.apis)])
		if err == nil || reveille.StatusOf(err) != 0 || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// kind is what the i-th wake-up goes through.
type kind struct {
	refused, canceled, tool bool
}

func (r *run) kindOf(i int) kind {
	every := func(n, offset int) bool { return n > 0 && i%n == offset%n }
	k := kind{refused: every(r.cfg.RefuseEvery, 1), tool: every(r.cfg.ApprovalsEvery, 0)}
	k.canceled = !k.refused && every(r.cfg.CancelEvery, 2)
	return k
}

// drive runs the clients, waits for the stragglers and reports.
func (r *run) drive(ctx context.Context) Report {
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	stopProgress := r.progress(start)
	for range r.cfg.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= r.cfg.Wakeups {
					return
				}
				r.one(ctx, i)
			}
		})
	}
	wg.Wait()
	r.recorder.awaitAll(ctx, r.cfg.Deadline)
	stopProgress()
	rep := r.recorder.summary(time.Since(start), r.cfg.Deadline)
	rep.Wakeups, rep.Errors = r.cfg.Wakeups, int(r.errs.Load())
	return rep
}

// progress prints a line every Progress until the returned func is called.
func (r *run) progress(start time.Time) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.Progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				accepted, woken := r.recorder.counts()
				el := time.Since(start)
				fmt.Fprintf(r.cfg.Out, "load: t=%s accepted=%d woken=%d waiting=%d errors=%d rate=%.0f/s\n",
					el.Round(time.Second), accepted, woken, accepted-woken, r.errs.Load(), float64(woken)/el.Seconds())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// one drives the i-th wake-up: its workflow is started and parks, its
// tool call (if any) is asked for and approved, its wake-up is created and,
// as its kind says, approved after a refusal or canceled; then it waits
// for the workflow to wake, up to the deadline (the stragglers are awaited
// again at the end).
func (r *run) one(ctx context.Context, i int) {
	k := r.kindOf(i)
	wf := r.org + "/load-" + r.id + "-" + strconv.Itoa(i)
	key := func(step string) reveille.CallOption {
		return reveille.WithIdempotencyKey(r.id + "-" + strconv.Itoa(i) + "-" + step)
	}
	var approvalID string
	if k.tool {
		err := r.call(ctx, i, func(p apiPair) error {
			a, err := p.agent.ToolApprovals.Request(ctx, wf, reveille.ToolCallRequest{AgentID: r.agent, ToolName: toolName,
				Input: map[string]any{"load": i}, WorkflowID: wf}, key("tool"))
			approvalID = a.ApprovalID
			if err == nil && a.Decision != "pending" {
				err = fmt.Errorf("tool call decided %s by %s, not left to a human", a.Decision, a.Source)
			}
			return err
		})
		if err != nil {
			r.fail(ctx, i, "ask for the tool call", err)
			return
		}
	}
	e := r.recorder.expect(wf, k)
	_, err := r.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: wf, TaskQueue: r.taskQueue(),
		WorkflowExecutionTimeout: 3 * r.cfg.Deadline}, WorkflowName, workflowInput{ApprovalID: approvalID, Timeout: 2 * r.cfg.Deadline})
	if err != nil {
		r.recorder.forget(wf)
		r.fail(ctx, i, "start the workflow", err)
		return
	}
	if k.tool {
		err := r.call(ctx, i, func(p apiPair) error {
			_, err := p.approver.ToolApprovals.Respond(ctx, wf, reveille.ToolCallResponse{ApprovalID: approvalID, Decision: "approved"}, key("tool-approve"))
			return err
		})
		if err != nil {
			r.recorder.forget(wf)
			r.fail(ctx, i, "approve the tool call", err)
			return
		}
	}
	wakeupID, err := r.wakeup(ctx, i, wf, k, e, key)
	if err != nil {
		r.recorder.forget(wf)
		r.fail(ctx, i, "wake-up", err)
		return
	}
	r.recorder.accepted(e, wakeupID)
	select {
	case <-e.done:
	case <-time.After(r.cfg.Deadline):
	case <-ctx.Done():
	}
}

// wakeupRequest is the wake-up of kind k for workflow wf, whose work calls
// the load's target at targetURL.
func wakeupRequest(agentID, wf, targetURL string, k kind) reveille.WakeupRequest {
	req := reveille.WakeupRequest{AgentID: agentID, WorkflowID: wf, Signal: wakeSignal, Scope: scopeFunded, Cost: 1,
		Reason: "engine load", Work: reveille.WakeupWork{Handler: "http", Args: map[string]any{"url": targetURL + "/ok"},
			// (as a platform would: an attempt cut by a replica's death —
			// a kill drill — is retried, not a wrong outcome)
			Retry: &reveille.RetryConfig{MaxAttempts: 3, InitialBackoffMS: 100}}}
	if k.refused {
		req.Scope = scopeRefused
	}
	if k.canceled {
		req.Work.Args = map[string]any{"url": targetURL + "/hold"}
	}
	return req
}

// wakeup creates the i-th wake-up and settles it as its kind says; it
// returns, with the wake-up's id, once the request that settles it was
// accepted. e notes when that request is first sent.
func (r *run) wakeup(ctx context.Context, i int, wf string, k kind, e *entry, key func(string) reveille.CallOption) (string, error) {
	req := wakeupRequest(r.agent, wf, r.target.url, k)
	var created reveille.WakeupCreated
	err := r.call(ctx, i, func(p apiPair) error {
		var err error
		created, err = p.agent.Wakeups.Create(ctx, req, key("wakeup"))
		return err
	})
	switch {
	case k.refused:
		var refusal *reveille.Error
		if !errors.As(err, &refusal) || refusal.Status != http.StatusPaymentRequired {
			return "", fmt.Errorf("want a refused spend (402), got %v", err)
		}
		r.recorder.settling(e)
		return refusal.WakeupID, r.call(ctx, i, func(p apiPair) error {
			_, err := p.approver.MandateApprovals.Approve(ctx, refusal.ApprovalID, reveille.Resolution{Note: "engine load"}, key("approve"))
			return err
		})
	case err != nil:
		return "", err
	case k.canceled:
		r.recorder.settling(e)
		return created.ID, r.call(ctx, i, func(p apiPair) error {
			_, err := p.agent.Wakeups.Cancel(ctx, created.ID)
			return err
		})
	}
	return created.ID, nil
}

// fail counts a wake-up whose requests failed for good; the first few are
// logged.
func (r *run) fail(ctx context.Context, i int, what string, err error) {
	if ctx.Err() != nil {
		return // interrupted, not failed: the run's error is ctx's
	}
	r.errs.Add(1)
	if r.logged.Add(1) <= 10 {
		r.cfg.Logger.Error("load: "+what+" failed", "wakeup", i, "error", err.Error())
	}
}

// recorder is the in-process meeting point of the clients and the
// workflows' reports: each wake-up is expected, accepted, then woken.
type recorder struct {
	mu        sync.Mutex
	entries   map[string]*entry
	nAccepted int
	nWoken    int
}

type entry struct {
	kind     kind
	wakeupID string    // the wake-up its workflow must wake with
	accepted time.Time // zero until its settling request was accepted
	// settling: when the approve or the cancel that settles a refused or
	// canceled wake-up was first sent (zero for the others, which their
	// create settles). A wake before it is wrong: the work ran, or the
	// wake-up ended, before anyone said so.
	settling time.Time
	woken    *woken
	wokenAt  time.Time
	done     chan struct{}
}

func newRecorder() *recorder { return &recorder{entries: map[string]*entry{}} }

// expect registers a workflow before it can wake.
func (rc *recorder) expect(wf string, k kind) *entry {
	e := &entry{kind: k, done: make(chan struct{})}
	rc.mu.Lock()
	rc.entries[wf] = e
	rc.mu.Unlock()
	return e
}

// forget drops a workflow whose wake-up was never accepted.
func (rc *recorder) forget(wf string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if e := rc.entries[wf]; e != nil && e.woken != nil {
		rc.nWoken--
	}
	delete(rc.entries, wf)
}

// accepted notes that e's settling request, for wake-up wakeupID, was
// accepted now.
func (rc *recorder) accepted(e *entry, wakeupID string) {
	rc.mu.Lock()
	e.accepted, e.wakeupID = time.Now(), wakeupID
	rc.nAccepted++
	rc.mu.Unlock()
}

// settling notes that e's settling request (an approve, a cancel) is
// about to be sent, the first time only.
func (rc *recorder) settling(e *entry) {
	rc.mu.Lock()
	if e.settling.IsZero() {
		e.settling = time.Now()
	}
	rc.mu.Unlock()
}

// woke is the workflows' local activity: it runs in this process when a
// workflow wakes. A repeat (the activity retried) is ignored.
func (rc *recorder) woke(_ context.Context, w woken) error {
	now := time.Now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e := rc.entries[w.WorkflowID]
	if e == nil || e.woken != nil {
		return nil
	}
	e.woken, e.wokenAt = &w, now
	rc.nWoken++
	close(e.done)
	return nil
}

func (rc *recorder) counts() (accepted, woken int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.nAccepted, rc.nWoken
}

// awaitAll waits until every accepted wake-up woke or passed its deadline.
func (rc *recorder) awaitAll(ctx context.Context, deadline time.Duration) {
	rc.mu.Lock()
	var waits []*entry
	for _, e := range rc.entries {
		if !e.accepted.IsZero() && e.woken == nil {
			waits = append(waits, e)
		}
	}
	rc.mu.Unlock()
	for _, e := range waits {
		select {
		case <-e.done:
		case <-time.After(time.Until(e.accepted.Add(deadline))):
		case <-ctx.Done():
			return
		}
	}
}

// summary sums up the entries.
func (rc *recorder) summary(elapsed, deadline time.Duration) Report {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rep := Report{Elapsed: elapsed}
	now := time.Now()
	var lat []time.Duration
	for _, e := range rc.entries {
		if e.accepted.IsZero() {
			continue
		}
		rep.Accepted++
		switch {
		case e.kind.refused:
			rep.Refused++
		case e.kind.canceled:
			rep.Canceled++
		}
		if e.kind.tool {
			rep.ToolCalls++
		}
		if e.woken == nil && now.Before(e.accepted.Add(deadline)) {
			rep.Interrupted++
			continue
		}
		// A wake past its deadline is lost whether it never came or came
		// late while the run was still going (else the verdict depends on
		// where in the run the wake-up fell).
		if e.woken == nil || e.wokenAt.Sub(e.accepted) > deadline {
			rep.Lost++
			continue
		}
		rep.Woken++
		rep.Duplicates += e.woken.Duplicates
		// (the wake of another wake-up — a second one created for this
		// request — is as wrong as a wrong outcome)
		// (and so is a wake before the approve or cancel that settles it
		// was sent: refused work ran without its approval)
		if !e.kind.outcomeOK(*e.woken) || e.wakeupID != "" && e.woken.WakeupID != e.wakeupID || e.woken.Others > 0 ||
			!e.settling.IsZero() && e.wokenAt.Before(e.settling) {
			rep.WrongOutcomes++
		}
		// The wake may be reported before the client read its answer.
		lat = append(lat, max(e.wokenAt.Sub(e.accepted), 0))
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		// Nearest rank, as engine bench's figures.
		rank := func(p int) time.Duration { return lat[max((n*p+99)/100-1, 0)] }
		rep.P50, rep.P99, rep.Max = rank(50), rank(99), lat[n-1]
	}
	return rep
}

// outcomeOK reports whether w is what a wake-up of kind k wakes with.
func (k kind) outcomeOK(w woken) bool {
	want := "succeeded"
	if k.canceled {
		want = "canceled"
	}
	return w.Outcome == want && (!k.tool || w.Decision == "approved")
}

// target is the HTTP service the wake-ups' work calls: /ok answers at
// once; /hold holds until its caller gives up (the wake-up is canceled)
// or the target closes.
type target struct {
	srv    *http.Server
	url    string
	closed chan struct{}
	once   sync.Once
}

func newTarget(addr string) (*target, error) {
	t := &target{closed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-t.closed:
		}
	})
	t.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("the load's target: %w", err)
	}
	t.url = "http://" + strings.Replace(ln.Addr().String(), "[::]", "127.0.0.1", 1)
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

// Close releases the held requests and stops the target.
func (t *target) Close() {
	t.once.Do(func() {
		close(t.closed)
		_ = t.srv.Close()
	})
}

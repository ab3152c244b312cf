package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/sync/errgroup"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workpool"
)

const (
	wakeBenchOrg      = "bench-org"
	wakeBenchScope    = "bench"
	wakeBenchSignal   = "wake"
	wakeBenchHandler  = "bench"
	wakeBenchWorkflow = "reveille.benchAwaitWake"
	// wakeBenchAwait bounds each parked workflow's wait, so a lost wake
	// shows up as an error instead of a hung benchmark.
	wakeBenchAwait = 2 * time.Minute
	// wakeBenchGrace is the dispatcher's NotFound grace here: the REST
	// phase signals workflows that never exist, and those should give up
	// soon instead of keeping the dispatcher busy for a minute.
	wakeBenchGrace = 2 * time.Second
	// wakeBenchLease is the dispatcher's claim lease (its default), given
	// explicitly because the stages read the claim instant back from it:
	// a claim sets next_attempt_at = now() + lease.
	wakeBenchLease = 30 * time.Second
	// wakeBenchHandoffLease is its lease of a handed-off message (the
	// default), set by the insert that claims it.
	wakeBenchHandoffLease = 15 * time.Second
)

// WakeConfig is one `engine bench wake` run.
type WakeConfig struct {
	// Service is the engine's configuration (its logger included); the
	// run replaces its database, API, dispatcher timing and worker, and
	// widens the wakeup pool to Concurrency.
	Service service.Config
	// N measured wakes and as many bare signals, Concurrency of each in
	// flight; RestN POST /v1/wakeups after them (0: none).
	N, Concurrency, RestN int
	// Together runs both sides at the same time; else Rounds alternating
	// rounds, one side after the other.
	Together bool
	Rounds   int
	// RestHold holds the REST wake-ups' work until their requests are all
	// answered.
	RestHold bool
	// Keep keeps the run's database and temporary directory.
	Keep bool
	// Settle is the pause between a workflow parking and its trigger.
	Settle time.Duration
	// CPUProfile, when set, is the file the measured rounds' CPU profile
	// goes to.
	CPUProfile string
}

// wakeBench is one run's parameters.
type wakeBench struct {
	n, concurrency, restN, rounds int
	together, restHold            bool
	settle                        time.Duration
	cpuProfile                    string
}

// Wake measures the wake latency — from the work handler's return to the
// parked workflow's receipt of the signal, observed as run.Get returning —
// beside a bare SignalWorkflow to the same parked workflow (SignalWorkflow
// call → run.Get returning) at the same concurrency, both sides at the
// same time in one process (or in alternating rounds); then the REST
// enqueue rate of POST /v1/wakeups.
func Wake(ctx context.Context, c WakeConfig) error {
	switch {
	case c.N < 1 || c.Concurrency < 1 || c.RestN < 0:
		return errors.New("need n ≥ 1, concurrency ≥ 1, rest-n ≥ 0")
	case c.Concurrency > workpool.MaxParallelismLimit:
		// (the wakeup pool is widened to it: refused before anything starts)
		return fmt.Errorf("need concurrency ≤ %d (a pool's most slots)", workpool.MaxParallelismLimit)
	case !c.Together && (c.Rounds < 1 || c.Rounds > c.N):
		// (rounds is used only with together=false)
		return errors.New("need 1 ≤ rounds ≤ n with together=false")
	}
	b := wakeBench{n: c.N, concurrency: c.Concurrency, restN: c.RestN, rounds: c.Rounds, together: c.Together,
		restHold: c.RestHold, settle: c.Settle, cpuProfile: c.CPUProfile}
	if b.together {
		b.rounds = 1
	}
	env, err := b.setUp(ctx, c)
	if env != nil {
		defer env.tearDown(c.Keep)
	}
	if err != nil {
		return err
	}
	return b.run(ctx, env)
}

func (b wakeBench) run(ctx context.Context, env *wakeEnv) error {
	// Warm up both paths (connections, the worker's caches, prepared
	// statements) before anything counts.
	warm := max(20, 2*b.concurrency)
	if _, err := env.measure(ctx, "warm-signal", 0, warm, b.concurrency, b.settle, env.bareSignal); err != nil {
		return fmt.Errorf("warm-up (signal): %w", err)
	}
	if _, err := env.measure(ctx, "warm-wake", 0, warm, b.concurrency, b.settle, env.wake); err != nil {
		return fmt.Errorf("warm-up (wake): %w", err)
	}

	stopProfile, err := startCPUProfile(b.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var sig, wake []wakeSample
	from := 0
	for r := range b.rounds {
		n := b.n / b.rounds
		if r < b.n%b.rounds {
			n++
		}
		if b.together {
			var s, w []wakeSample
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() (err error) {
				s, err = env.measure(gctx, "signal", from, n, b.concurrency, b.settle, env.bareSignal)
				return err
			})
			g.Go(func() (err error) {
				w, err = env.measure(gctx, "wake", from, n, b.concurrency, b.settle, env.wake)
				return err
			})
			if err := g.Wait(); err != nil {
				return err
			}
			sig, wake = append(sig, s...), append(wake, w...)
			from += n
			continue
		}
		// Alternate which side goes first, so that a drift in the
		// machine's load favours neither.
		for j := range 2 {
			if (r+j)%2 == 0 {
				s, err := env.measure(ctx, "signal", from, n, b.concurrency, b.settle, env.bareSignal)
				if err != nil {
					return fmt.Errorf("bare signals: %w", err)
				}
				sig = append(sig, s...)
			} else {
				w, err := env.measure(ctx, "wake", from, n, b.concurrency, b.settle, env.wake)
				if err != nil {
					return fmt.Errorf("wakes: %w", err)
				}
				wake = append(wake, w...)
			}
		}
		from += n
	}
	stopProfile()
	// After both sides, so that its reads load neither.
	if err := env.hookStarts(ctx, wake); err != nil {
		return err
	}

	st, wt := wakeTotals(sig), wakeTotals(wake)
	fmt.Printf("signal: n=%d p50=%sms p99=%sms max=%sms\n", len(st), wakeMS(wakePct(st, 50)), wakeMS(wakePct(st, 99)), wakeMS(slices.Max(st)))
	fmt.Printf("wake: n=%d p50=%sms p99=%sms max=%sms\n", len(wt), wakeMS(wakePct(wt, 50)), wakeMS(wakePct(wt, 99)), wakeMS(slices.Max(wt)))
	r50 := float64(wakePct(wt, 50)) / float64(wakePct(st, 50))
	r99 := float64(wakePct(wt, 99)) / float64(wakePct(st, 99))
	how := fmt.Sprintf("%d rounds one after the other", b.rounds)
	if b.together {
		how = "both sides at the same time"
	}
	fmt.Printf("wake/signal: p50=%.2fx p99=%.2fx (bar: ≤1.20x, ≤1.50x; concurrency %d each, %s)\n", r50, r99, b.concurrency, how)
	if len(st) < b.n || len(wt) < b.n {
		fmt.Printf("  never parked, not measured: signal %d, wake %d\n", b.n-len(st), b.n-len(wt))
	}
	fmt.Printf("  signal stages p50/p99: send %sms, sent→receipt %sms\n",
		wakeStage(sig, func(s wakeSample) time.Duration { return s.send }),
		wakeStage(sig, func(s wakeSample) time.Duration { return s.sent - s.send }))
	fmt.Printf("  wake stages p50/p99: handler→send %sms (handler→hook tx %sms, hook tx→claim %sms, claim→send %sms), send %sms, sent→receipt %sms\n",
		wakeStage(wake, func(s wakeSample) time.Duration { return s.toSend }),
		wakeStage(wake, func(s wakeSample) time.Duration { return s.toHook }),
		wakeStage(wake, func(s wakeSample) time.Duration { return s.toClaim - s.toHook }),
		wakeStage(wake, func(s wakeSample) time.Duration { return s.toSend - s.toClaim }),
		wakeStage(wake, func(s wakeSample) time.Duration { return s.send }),
		wakeStage(wake, func(s wakeSample) time.Duration { return s.sent - s.send }))

	if b.restN > 0 {
		rest, err := env.restEnqueue(ctx, b.restN, b.concurrency, b.restHold)
		if err != nil {
			return fmt.Errorf("rest enqueue: %w", err)
		}
		fmt.Printf("rest enqueue: n=%d rate=%.0f/s (concurrency %d, %s; request p50=%sms p99=%sms)\n",
			b.restN, float64(b.restN)/rest.elapsed.Seconds(), b.concurrency, rest.elapsed.Round(time.Millisecond),
			wakeMS(wakePct(rest.latencies, 50)), wakeMS(wakePct(rest.latencies, 99)))
	}
	return nil
}

// wakeSample is one measured wake or bare signal. total is the reported
// latency; the stages split it: toSend (wake only) from the handler's
// return to the dispatcher's SignalWorkflow call, send that call's
// duration, sent (as an offset from the start of send) the workflow's
// completion seen by the client; toHook (wake only) is the part of toSend
// until the transaction that ran the wakeup hook began (its queue message's
// created_at: now() is the transaction's start), toClaim until the
// dispatcher's claim of the message began.
type wakeSample struct {
	id                                         string // the workflow's
	total, toHook, toClaim, toSend, send, sent time.Duration
	skipped                                    bool // never parked: not measured
}

// wakeEnv is the engine the benchmark drives, and what it must stop.
type wakeEnv struct {
	where     *where
	svc       *service.Service
	running   *running
	logger    *slog.Logger
	taskQueue string
	agent     string
	secret    []byte
	apiURL    string

	restHold chan struct{} // closed when the REST wake-ups' work may finish

	returned *wakeStamps // handler return, by args key (the workflow id)
	sends    *wakeStamps // dispatcher's SignalWorkflow call, by workflow id
	sentAt   *wakeStamps // …and its successful return

	mu        sync.Mutex
	wakeupIDs map[string]uuid.UUID // the wake-up of each wake's workflow
}

// setUp starts (or connects to) Postgres and Temporal and builds and runs
// the engine through internal/service, as serve does, with a handler
// "bench" that returns at once, a worker that also runs the parked
// workflow, a dispatcher whose sends are timed, and a funded mandate. On
// error the returned env, if any, still needs tearDown.
func (b wakeBench) setUp(ctx context.Context, c WakeConfig) (*wakeEnv, error) {
	env := &wakeEnv{
		logger: c.Service.Logger, taskQueue: "bench-wake-" + uuid.NewString(),
		agent: "bench-agent-" + uuid.NewString()[:8], restHold: make(chan struct{}),
		returned: newWakeStamps(), sends: newWakeStamps(), sentAt: newWakeStamps(), wakeupIDs: map[string]uuid.UUID{},
	}
	var err error
	env.where, err = setUp(ctx, c.Service, "wake", "", true)
	if err != nil {
		return env, err
	}
	cfg, secret := serviceConfig(c.Service, env.where, env.logger)
	env.secret = secret
	// Every parked workflow's work must be able to run at once, or the
	// pool's queueing would be measured instead of the wake path.
	cfg.Workpool.Pools = maps.Clone(cfg.Workpool.Pools)
	if cfg.Workpool.Pools == nil {
		cfg.Workpool.Pools, _ = workpool.ParsePools(workpool.DefaultPools)
	}
	cfg.Workpool.Pools[wakeup.DefaultPool] = max(cfg.Workpool.Pools[wakeup.DefaultPool], b.concurrency)
	cfg.Dispatcher.NotFoundGrace, cfg.Dispatcher.Lease = wakeBenchGrace, wakeBenchLease
	cfg.Dispatcher.HandoffLease = wakeBenchHandoffLease
	cfg.WrapSignaler = func(next queue.Signaler) queue.Signaler { return wakeTimedSignaler{env, next} }
	cfg.Worker = &service.WorkerConfig{TaskQueue: env.taskQueue, Register: func(r worker.Registry) {
		r.RegisterWorkflowWithOptions(benchAwaitWake, workflow.RegisterOptions{Name: wakeBenchWorkflow})
	}}
	if env.svc, err = service.New(ctx, cfg); err != nil {
		return env, err
	}
	env.svc.Workpool().Register(wakeBenchHandler, env.benchHandler)
	if env.running, err = start(ctx, env.svc); err != nil {
		return env, err
	}
	env.apiURL = "http://" + env.running.addr
	budget := int64(2*(b.n+b.restN) + 20*b.concurrency + 1000)
	if _, err := env.svc.Mandates().Create(ctx, wakeBenchOrg, mandates.CreateParams{AgentID: env.agent, Scope: wakeBenchScope, Budget: budget}); err != nil {
		return env, fmt.Errorf("bench mandate: %w", err)
	}
	return env, nil
}

// tearDown stops everything; it tolerates a half-built env.
func (e *wakeEnv) tearDown(keep bool) {
	if e.running != nil {
		e.running.stop()
	}
	if e.svc != nil {
		e.svc.Close()
	}
	if e.where != nil {
		e.where.tearDown(keep)
	}
}

// benchAwaitWake is the parked workflow: it awaits one wake and returns it.
func benchAwaitWake(ctx workflow.Context, timeout time.Duration) (workflows.Wake, error) {
	return workflows.AwaitWake(ctx, wakeBenchSignal, timeout)
}

// benchHandler is the work every bench wake-up runs: it notes when it
// returns (the start of the measured wake) and returns at once — or, for
// the REST phase's wake-ups ("hold"), once that phase is over.
func (e *wakeEnv) benchHandler(ctx context.Context, j workpool.Job) (json.RawMessage, error) {
	var args struct {
		Key  string `json:"key"`
		Hold bool   `json:"hold"`
	}
	_ = json.Unmarshal(j.Args, &args)
	if args.Hold {
		select {
		case <-e.restHold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if args.Key != "" {
		e.returned.set(args.Key, time.Now())
	}
	return nil, nil
}

// wakeTimedSignaler is the dispatcher's view of the one Temporal client,
// noting when each parked workflow's signal is sent so that the wake
// latency can be split into stages.
type wakeTimedSignaler struct {
	e    *wakeEnv
	next queue.Signaler
}

func (t wakeTimedSignaler) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	start := time.Now()
	err := t.next.SignalWorkflow(ctx, workflowID, runID, name, arg)
	if err == nil && !strings.HasPrefix(workflowID, wakeBenchOrg+"/rest-") {
		t.e.sends.set(workflowID, start)
		t.e.sentAt.set(workflowID, time.Now())
	}
	return err
}

// measure runs n parked workflows through trigger, concurrency at a time.
// Each is started, awaited until parked (its first workflow task
// completed, so both sides measure a parked workflow), then trigger wakes
// it and reports the instant the measured span starts.
func (e *wakeEnv) measure(ctx context.Context, kind string, from, n, concurrency int, settle time.Duration,
	trigger func(ctx context.Context, id string, run client.WorkflowRun) (time.Time, error)) ([]wakeSample, error) {
	samples := make([]wakeSample, n)
	began := time.Now()
	defer func() {
		fmt.Fprintf(os.Stderr, "bench wake: %s %d–%d done in %s\n", kind, from, from+n-1, time.Since(began).Round(time.Millisecond))
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for i := range n {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			id := fmt.Sprintf("%s/%s-%d", wakeBenchOrg, kind, from+i)
			run, err := e.svc.Temporal().ExecuteWorkflow(gctx, client.StartWorkflowOptions{
				ID: id, TaskQueue: e.taskQueue, WorkflowExecutionTimeout: 2 * wakeBenchAwait,
				// A run left over from an interrupted bench on a shared
				// Temporal must not be mistaken for this one.
				WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING,
			}, wakeBenchWorkflow, wakeBenchAwait)
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				samples[i].skipped = e.skip(id, "", fmt.Errorf("start: %w", err))
				return nil
			}
			if err := e.waitParked(gctx, id, run.GetRunID()); err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				samples[i].skipped = e.skip(id, run.GetRunID(), fmt.Errorf("never parked: %w", err))
				return nil
			}
			// Wait for the result from well before the trigger (the
			// settle), so the receipt is seen as soon as the client can see
			// it and the Get's own first read is not on the measured path.
			type receipt struct {
				at   time.Time
				wake workflows.Wake
				err  error
			}
			done := make(chan receipt, 1)
			go func() {
				var r receipt
				r.err = run.Get(gctx, &r.wake)
				r.at = time.Now()
				done <- r
			}()
			if settle > 0 {
				select {
				case <-gctx.Done():
					return gctx.Err()
				case <-time.After(settle):
				}
			}
			start, err := trigger(gctx, id, run)
			if err != nil {
				return err // the group's cancel ends the Get
			}
			r := <-done
			if r.err != nil {
				return fmt.Errorf("%s: %w", id, r.err)
			}
			if r.wake.Outcome != workflows.OutcomeSucceeded {
				return fmt.Errorf("%s woke with %q (%s)", id, r.wake.Outcome, r.wake.Error)
			}
			if kind == "wake" || kind == "warm-wake" {
				start, _ = e.returned.get(id)
			}
			s := wakeSample{id: id, total: r.at.Sub(start)}
			if sendAt, ok := e.sends.get(id); ok {
				sentAt, _ := e.sentAt.get(id)
				s.toSend, s.send, s.sent = sendAt.Sub(start), sentAt.Sub(sendAt), r.at.Sub(sendAt)
			}
			samples[i] = s
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	measured := slices.DeleteFunc(samples, func(s wakeSample) bool { return s.skipped })
	if skipped := n - len(measured); skipped > n/20 {
		return nil, fmt.Errorf("%d of %d %s workflows never parked: Temporal is overloaded", skipped, n, kind)
	}
	return measured, ctx.Err()
}

// skip reports a workflow that could not be parked — Temporal being slow
// or overloaded before anything was measured — and terminates it; the item
// counts on neither side.
func (e *wakeEnv) skip(id, runID string, cause error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state := ""
	if runID != "" {
		if d, err := e.svc.Temporal().DescribeWorkflowExecution(ctx, id, runID); err == nil {
			state = fmt.Sprintf(" (status %s, %d history events, pending workflow task: %v)",
				d.GetWorkflowExecutionInfo().GetStatus(), d.GetWorkflowExecutionInfo().GetHistoryLength(), d.GetPendingWorkflowTask())
		}
		_ = e.svc.Temporal().TerminateWorkflow(ctx, id, runID, "bench wake: never parked")
	}
	fmt.Fprintf(os.Stderr, "bench wake: skipping %s: %v%s\n", id, cause, state)
	return true
}

// hookStarts fills toHook and toClaim from the wake signals' queue
// messages, read through the queue's API by their key (the wake-up's id):
// created_at is the start of the transaction that completed the work and
// ran the wakeup hook, next_attempt_at − lease the start of the claim (the
// clocks are the same machine's).
func (e *wakeEnv) hookStarts(ctx context.Context, samples []wakeSample) error {
	for i := range samples {
		e.mu.Lock()
		id, ok := e.wakeupIDs[samples[i].id]
		e.mu.Unlock()
		if !ok {
			continue
		}
		m, err := queue.GetByKey(ctx, e.svc.DB(), wakeBenchOrg, wakeup.Queue, id.String())
		if errors.Is(err, queue.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading a wake signal's message: %w", err)
		}
		// Delivered at the first attempt (as here), next_attempt_at is
		// still the one the claim set — the insert's, for a handoff.
		claimed := m.NextAttemptAt.Add(-wakeBenchLease)
		if m.NextAttemptAt.Sub(m.CreatedAt) < wakeBenchLease {
			claimed = m.NextAttemptAt.Add(-wakeBenchHandoffLease)
		}
		ret, _ := e.returned.get(samples[i].id)
		samples[i].toHook, samples[i].toClaim = m.CreatedAt.Sub(ret), claimed.Sub(ret)
	}
	return nil
}

// bareSignal is the baseline trigger: one SignalWorkflow through the same
// client, timed from the call.
func (e *wakeEnv) bareSignal(ctx context.Context, id string, run client.WorkflowRun) (time.Time, error) {
	start := time.Now()
	w := workflows.Wake{OrgID: wakeBenchOrg, WakeupID: "signal:" + id, Outcome: workflows.OutcomeSucceeded}
	if err := e.svc.Temporal().SignalWorkflow(ctx, id, run.GetRunID(), wakeBenchSignal, w); err != nil {
		return start, fmt.Errorf("signal %s: %w", id, err)
	}
	e.sends.set(id, start)
	e.sentAt.set(id, time.Now())
	return start, nil
}

// wake is the measured trigger: a wake-up through the Go API, cost 1, whose
// work is the bench handler; the span starts when the handler returns.
func (e *wakeEnv) wake(ctx context.Context, id string, run client.WorkflowRun) (time.Time, error) {
	w, err := e.svc.Wakeups().Create(ctx, wakeup.CreateParams{
		OrgID: wakeBenchOrg, AgentID: e.agent, WorkflowID: id, RunID: run.GetRunID(), Signal: wakeBenchSignal,
		Scope: wakeBenchScope, Reason: "bench wake", Cost: 1,
		Work: wakeup.Work{Handler: wakeBenchHandler, Args: json.RawMessage(fmt.Sprintf(`{"key":%q}`, id))},
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("wake-up for %s: %w", id, err)
	}
	e.mu.Lock()
	e.wakeupIDs[id] = w.ID
	e.mu.Unlock()
	return time.Time{}, nil // the span starts at the handler's return
}

// waitParked long-polls the workflow's history until its first workflow
// task completed: from then on it sits in AwaitWake.
func (e *wakeEnv) waitParked(ctx context.Context, id, runID string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	it := e.svc.Temporal().GetWorkflowHistory(ctx, id, runID, true, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return err
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			return nil
		}
	}
	return errors.New("its history ended first")
}

type wakeRestResult struct {
	elapsed   time.Duration
	latencies []time.Duration
}

// restEnqueue posts n wake-ups through the Go client from concurrency
// clients, each for its own (never started) workflow and with its own
// Idempotency-Key, as an agent would; it reports the wall time of the n
// and each request's. With hold, their work waits until the last answer.
func (e *wakeEnv) restEnqueue(ctx context.Context, n, concurrency int, hold bool) (wakeRestResult, error) {
	defer close(e.restHold)
	tok, err := api.SignToken(e.secret, api.TokenSpec{OrgID: wakeBenchOrg, Sub: "bench", AgentID: e.agent, Roles: []string{api.RoleAgent}, TTL: time.Hour})
	if err != nil {
		return wakeRestResult{}, err
	}
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		MaxIdleConns: concurrency, MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency,
	}}
	defer hc.CloseIdleConnections()
	// One attempt per request: a retry would hide a failure in a longer
	// latency, and the run ends at the first failure instead.
	rc, err := reveille.New(e.apiURL, reveille.WithToken(tok), reveille.WithHTTPClient(hc),
		reveille.WithRetry(reveille.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		return wakeRestResult{}, err
	}
	tag := uuid.NewString()[:8]
	post := func(ctx context.Context, i int) error {
		wf := fmt.Sprintf("%s/rest-%s-%d", wakeBenchOrg, tag, i)
		_, err := rc.Wakeups.Create(ctx, reveille.WakeupRequest{
			AgentID: e.agent, WorkflowID: wf, Signal: wakeBenchSignal, Scope: wakeBenchScope, Reason: "bench rest", Cost: 1,
			Work: reveille.WakeupWork{Handler: wakeBenchHandler, Args: map[string]any{"hold": hold}},
		}, reveille.WithIdempotencyKey(wf))
		return err
	}
	run := func(first, n int, lat []time.Duration) error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(concurrency)
		for i := range n {
			g.Go(func() error {
				t := time.Now()
				err := post(gctx, first+i)
				if lat != nil {
					lat[i] = time.Since(t)
				}
				return err
			})
		}
		return g.Wait()
	}
	// Warm up the connections and the route first.
	warm := 2 * concurrency
	if err := run(0, warm, nil); err != nil {
		return wakeRestResult{}, err
	}
	res := wakeRestResult{latencies: make([]time.Duration, n)}
	start := time.Now()
	err = run(warm, n, res.latencies)
	res.elapsed = time.Since(start)
	return res, err
}

// wakeStamps are instants by key, written from many goroutines.
type wakeStamps struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func newWakeStamps() *wakeStamps { return &wakeStamps{m: map[string]time.Time{}} }

func (s *wakeStamps) set(k string, t time.Time) {
	s.mu.Lock()
	s.m[k] = t
	s.mu.Unlock()
}

func (s *wakeStamps) get(k string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.m[k]
	return t, ok
}

func wakeTotals(s []wakeSample) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, x := range s {
		out[i] = x.total
	}
	return out
}

// wakePct is the nearest-rank percentile p of d.
func wakePct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// wakeStage formats the p50 and p99 of one stage as "p50/p99".
func wakeStage(s []wakeSample, f func(wakeSample) time.Duration) string {
	d := make([]time.Duration, len(s))
	for i, x := range s {
		d[i] = f(x)
	}
	return wakeMS(wakePct(d, 50)) + "/" + wakeMS(wakePct(d, 99))
}

func wakeMS(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

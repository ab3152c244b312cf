package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/sync/errgroup"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/internal/devstack"
	"github.com/reveille/reveille/internal/devstack/devtemporal"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/migrations"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
	"github.com/reveille/reveille/workpool"
)

func init() { benches["wake"] = benchWake }

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
)

// wakeBench is one run's parameters.
type wakeBench struct {
	n, concurrency, restN, rounds int
	keep, together, restHold      bool
	settle                        time.Duration
	cpuProfile                    string
}

// benchWake measures the wake latency — from the work handler's return to
// the parked workflow's receipt of the signal, observed as run.Get
// returning — beside a bare SignalWorkflow to the same parked workflow
// (SignalWorkflow call → run.Get returning) at the same concurrency, both
// sides at the same time in one process (or in alternating rounds); then
// the REST enqueue rate of POST /v1/wakeups.
func benchWake(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench wake", flag.ContinueOnError)
	var b wakeBench
	fs.IntVar(&b.n, "n", 1000, "measured wakes (and as many bare signals)")
	fs.IntVar(&b.concurrency, "concurrency", 50, "workflows in flight at once, for both the wake and the bare-signal runs")
	fs.IntVar(&b.restN, "rest-n", 2000, "POST /v1/wakeups requests for the REST enqueue rate (0 skips it)")
	fs.BoolVar(&b.together, "together", true, "run the bare-signal and the wake side at the same time, each at --concurrency, so that a drift in the (shared) machine's load hits both alike; false: one after the other, in --rounds")
	fs.IntVar(&b.rounds, "rounds", 2, "with --together=false: rounds the n are split over, each a bare-signal run and a wake run, which goes first alternating")
	fs.BoolVar(&b.restHold, "rest-hold", true, "hold the REST wake-ups' work until their requests are all answered: their signals go to workflows that never exist and are retried until the NotFound grace ends, several sends each, load that production (one send per wake-up) does not have")
	fs.BoolVar(&b.keep, "keep", false, "keep the temporary directories of the local Postgres and Temporal (their paths are printed)")
	fs.DurationVar(&b.settle, "settle", 100*time.Millisecond, "pause between a workflow parking and its trigger, on both sides, so that neither lands on the tail of Temporal's work for the parking task")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured rounds to this file")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, `Usage: engine bench wake [flags]

Uses DATABASE_URL and TEMPORAL_ADDRESS (TEMPORAL_NAMESPACE) when set, or else
starts a local Postgres (durable settings) and an embedded Temporal in a
temporary directory. Wires workpool, mandates, wakeup, the signal dispatcher
and one Temporal client as serve does, with a handler "bench" that returns at
once, and parks workflows (ids bench-org/wake-<i>, bench-org/signal-<i>) on a
task queue of their own.

Prints:
  signal: n=… p50=…ms p99=…ms max=…ms   bare SignalWorkflow → run.Get returns
  wake: n=… p50=…ms p99=…ms max=…ms     handler returns → run.Get returns
  the ratios wake/signal at p50 and p99, each side split into stages,
  rest enqueue: n=… rate=…/s            POST /v1/wakeups, concurrency clients

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if b.n < 1 || b.concurrency < 1 || b.restN < 0 || b.rounds < 1 || b.rounds > b.n {
		return errors.New("need n ≥ 1, concurrency ≥ 1, rest-n ≥ 0, 1 ≤ rounds ≤ n")
	}
	if b.together {
		b.rounds = 1
	}
	env, err := b.setUp(ctx)
	if env != nil {
		defer env.tearDown()
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
	total, toHook, toClaim, toSend, send, sent time.Duration
	skipped                                    bool // never parked: not measured
}

// wakeEnv is the wired engine the benchmark drives, and what it must stop.
type wakeEnv struct {
	dir        string // temporary directory of the local stack ("" when external)
	keep       bool
	logger     *slog.Logger
	pg         *devstack.Postgres
	temporal   *devtemporal.Server
	db         *pgxpool.Pool
	tc         client.Client
	pool       *workpool.Manager
	mandates   *mandates.Service
	wakeups    *wakeup.Service
	dispatcher *queue.Dispatcher
	worker     worker.Worker
	taskQueue  string
	agent      string
	secret     []byte
	apiURL     string
	stopAPI    context.CancelFunc
	apiDone    chan struct{}
	started    []component // in start order

	restHold chan struct{} // closed when the REST wake-ups' work may finish

	returned *wakeStamps // handler return, by args key (the workflow id)
	sends    *wakeStamps // dispatcher's SignalWorkflow call, by workflow id
	sentAt   *wakeStamps // …and its successful return
}

// setUp starts (or connects to) Postgres and Temporal and wires the engine
// as serve does. On error the returned env, if any, still needs tearDown.
func (b wakeBench) setUp(ctx context.Context) (*wakeEnv, error) {
	s, err := envConfig()
	if err != nil {
		return nil, err
	}
	level := os.Getenv("REVEILLE_LOG_LEVEL")
	if level == "" {
		// The REST phase's signals to absent workflows end as warnings,
		// thousands of them; only errors matter here.
		level = "error"
	}
	env := &wakeEnv{
		keep: b.keep, logger: newLogger(level), taskQueue: "bench-wake-" + uuid.NewString(),
		agent: "bench-agent-" + uuid.NewString()[:8], restHold: make(chan struct{}),
		returned: newWakeStamps(), sends: newWakeStamps(), sentAt: newWakeStamps(),
	}
	if s.DatabaseURL == "" || s.TemporalAddr == "" {
		if env.dir, err = os.MkdirTemp("", "reveille-bench-wake-*"); err != nil {
			return nil, err
		}
	}
	if s.DatabaseURL == "" {
		// Durable defaults: fsync and synchronous_commit stay on, so commit
		// cost is what production pays.
		env.pg, err = devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: filepath.Join(env.dir, "pg")})
		if err != nil {
			return env, fmt.Errorf("local Postgres: %w", err)
		}
		if err := env.pg.EnsureDatabase(ctx, "reveille"); err != nil {
			return env, err
		}
		s.DatabaseURL = env.pg.URL("reveille")
	}
	if s.TemporalAddr == "" {
		env.temporal, err = devtemporal.Start(ctx, devtemporal.Options{DataDir: filepath.Join(env.dir, "temporal"), Namespace: s.Namespace})
		if err != nil {
			return env, fmt.Errorf("embedded Temporal: %w", err)
		}
		s.TemporalAddr = env.temporal.Address()
	}
	if env.dir != "" && b.keep {
		fmt.Fprintf(os.Stderr, "bench wake: keeping %s\n", env.dir)
	}

	// The database pool and the Temporal client as newApp makes them.
	cfg, err := pgxpool.ParseConfig(s.DatabaseURL)
	if err != nil {
		return env, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if cfg.MaxConns < 20 {
		cfg.MaxConns = 20
	}
	if env.db, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return env, fmt.Errorf("connect to Postgres: %w", err)
	}
	if _, err := migrations.UpPool(ctx, env.db, nil); err != nil {
		return env, err
	}
	env.tc, err = client.NewLazyClient(client.Options{HostPort: s.TemporalAddr, Namespace: s.Namespace, Logger: service.TemporalLogger(env.logger)})
	if err != nil {
		return env, fmt.Errorf("temporal client for %s: %w", s.TemporalAddr, err)
	}
	return env, env.wire(ctx, s, b.concurrency, int64(2*(b.n+b.restN)+20*b.concurrency+1000))
}

// wire builds and starts the domain services as wireDomain does, plus the
// bench handler, the bench workflow's worker, a funded mandate and the API.
func (e *wakeEnv) wire(ctx context.Context, s settings, concurrency int, budget int64) error {
	reg := prometheus.NewRegistry()
	poolCfg := s.workpoolConfig()
	// Every parked workflow's work must be able to run at once, or the
	// pool's queueing would be measured instead of the wake path.
	poolCfg.Pools[wakeup.DefaultPool] = max(poolCfg.Pools[wakeup.DefaultPool], concurrency)
	poolCfg.Logger, poolCfg.Registry = e.logger, reg
	var err error
	if e.pool, err = workpool.New(e.db, poolCfg); err != nil {
		return fmt.Errorf("workpool: %w", err)
	}
	if err := registerHandlers(e.pool, s, reg); err != nil {
		return err
	}
	e.pool.Register(wakeBenchHandler, e.benchHandler)
	e.mandates = mandates.New(e.db, mandates.Config{ApprovalTTL: s.ApprovalTTL, Logger: e.logger, Registry: reg})
	e.wakeups = wakeup.New(e.db, e.pool, e.mandates, wakeup.Config{Logger: e.logger, Registry: reg})
	e.dispatcher = queue.NewDispatcher(e.db, wakeTimedSignaler{e}, queue.DispatcherConfig{NotFoundGrace: wakeBenchGrace, Lease: wakeBenchLease, Logger: e.logger, Registry: reg})
	for _, c := range []component{e.pool, e.mandates, e.wakeups, e.dispatcher} {
		if err := c.Start(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("start: %w", err)
		}
		e.started = append(e.started, c)
	}
	// A pool that already existed (external DATABASE_URL) keeps its limit.
	if p, err := e.pool.Pool(ctx, wakeBenchOrg, wakeup.DefaultPool); err != nil {
		return err
	} else if p.MaxParallelism < concurrency {
		if err := e.pool.SetMaxParallelism(ctx, wakeup.DefaultPool, concurrency); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench wake: raised pool %q max_parallelism from %d to %d\n", wakeup.DefaultPool, p.MaxParallelism, concurrency)
	}

	e.worker = reference.NewWorker(e.tc, e.taskQueue, e.wakeups, nil) // the bench runs no tool step
	e.worker.RegisterWorkflowWithOptions(benchAwaitWake, workflow.RegisterOptions{Name: wakeBenchWorkflow})
	if err := e.worker.Start(); err != nil {
		return fmt.Errorf("temporal worker: %w", err)
	}

	// A fresh agent per run, so runs against a shared database never meet
	// an existing mandate.
	if _, err := e.mandates.Create(ctx, wakeBenchOrg, mandates.CreateParams{AgentID: e.agent, Scope: wakeBenchScope, Budget: budget}); err != nil {
		return fmt.Errorf("bench mandate: %w", err)
	}

	e.secret = make([]byte, 32)
	if _, err := rand.Read(e.secret); err != nil {
		return err
	}
	srv, err := api.New(ctx, api.Config{Addr: "127.0.0.1:0", Logger: e.logger, Registry: reg, Auth: api.AuthConfig{Secrets: [][]byte{e.secret}}},
		api.Services{DB: e.db, Mandates: e.mandates, Wakeups: e.wakeups})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.apiURL = "http://" + ln.Addr().String()
	actx, stop := context.WithCancel(context.WithoutCancel(ctx))
	e.stopAPI, e.apiDone = stop, make(chan struct{})
	go func() {
		defer close(e.apiDone)
		if err := srv.Serve(actx, ln); err != nil {
			e.logger.Error("bench API stopped", "error", err.Error())
		}
	}()
	return nil
}

// tearDown stops everything in reverse order; it tolerates a half-built env.
func (e *wakeEnv) tearDown() {
	if e.stopAPI != nil {
		e.stopAPI()
		<-e.apiDone
	}
	if e.worker != nil {
		e.worker.Stop()
	}
	for _, c := range slices.Backward(e.started) {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := c.Stop(sctx); err != nil {
			e.logger.Warn("stopping a bench component failed", "error", err.Error())
		}
		cancel()
	}
	if e.tc != nil {
		e.tc.Close()
	}
	if e.db != nil {
		e.db.Close()
	}
	if e.temporal != nil {
		_ = e.temporal.Stop()
	}
	if e.pg != nil {
		_ = e.pg.Stop(context.Background())
	}
	if e.dir != "" && !e.keep {
		if e.pg != nil {
			// A root-run cluster may live outside dir (see devstack).
			_ = os.RemoveAll(e.pg.ClusterDir())
		}
		_ = os.RemoveAll(e.dir)
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

// component is the Start/Stop lifecycle every background part shares.
type component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// wakeTimedSignaler is the dispatcher's view of the one Temporal client,
// noting when each parked workflow's signal is sent so that the wake
// latency can be split into stages.
type wakeTimedSignaler struct{ e *wakeEnv }

func (t wakeTimedSignaler) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	start := time.Now()
	err := t.e.tc.SignalWorkflow(ctx, workflowID, runID, name, arg)
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
			run, err := e.tc.ExecuteWorkflow(gctx, client.StartWorkflowOptions{
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
			s := wakeSample{total: r.at.Sub(start)}
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
	if kind == "wake" || kind == "warm-wake" {
		if err := e.hookStarts(ctx, kind, from, began, samples); err != nil {
			return nil, err
		}
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
		if d, err := e.tc.DescribeWorkflowExecution(ctx, id, runID); err == nil {
			state = fmt.Sprintf(" (status %s, %d history events, pending workflow task: %v)",
				d.GetWorkflowExecutionInfo().GetStatus(), d.GetWorkflowExecutionInfo().GetHistoryLength(), d.GetPendingWorkflowTask())
		}
		_ = e.tc.TerminateWorkflow(ctx, id, runID, "bench wake: never parked")
	}
	fmt.Fprintf(os.Stderr, "bench wake: skipping %s: %v%s\n", id, cause, state)
	return true
}

// hookStarts fills toHook and toClaim from the wake signals' queue
// messages: created_at is the start of the transaction that completed the
// work and ran the wakeup hook, next_attempt_at − lease the start of the
// claim (the clocks are the same machine's); since skips the messages of
// earlier runs against a shared database.
func (e *wakeEnv) hookStarts(ctx context.Context, kind string, from int, since time.Time, samples []wakeSample) error {
	ids := make([]string, len(samples))
	for i := range samples {
		ids[i] = fmt.Sprintf("%s/%s-%d", wakeBenchOrg, kind, from+i)
	}
	rows, err := e.db.Query(ctx, `SELECT signal_workflow_id, created_at, next_attempt_at FROM queue_messages
		WHERE org_id = $1 AND queue = $2 AND signal_workflow_id = ANY($3) AND created_at >= $4`, wakeBenchOrg, wakeup.Queue, ids, since)
	if err != nil {
		return fmt.Errorf("reading the wake signals' messages: %w", err)
	}
	type stamps struct{ created, claimed time.Time }
	msgs := map[string]stamps{}
	var id string
	var created, next time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &created, &next}, func() error {
		// Delivered at the first attempt (as here), next_attempt_at is
		// still the one the claim set.
		msgs[id] = stamps{created: created, claimed: next.Add(-wakeBenchLease)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the wake signals' messages: %w", err)
	}
	for i := range samples {
		if m, ok := msgs[ids[i]]; ok {
			ret, _ := e.returned.get(ids[i])
			samples[i].toHook, samples[i].toClaim = m.created.Sub(ret), m.claimed.Sub(ret)
		}
	}
	return nil
}

// bareSignal is the baseline trigger: one SignalWorkflow through the same
// client, timed from the call.
func (e *wakeEnv) bareSignal(ctx context.Context, id string, run client.WorkflowRun) (time.Time, error) {
	start := time.Now()
	w := workflows.Wake{OrgID: wakeBenchOrg, WakeupID: "signal:" + id, Outcome: workflows.OutcomeSucceeded}
	if err := e.tc.SignalWorkflow(ctx, id, run.GetRunID(), wakeBenchSignal, w); err != nil {
		return start, fmt.Errorf("signal %s: %w", id, err)
	}
	e.sends.set(id, start)
	e.sentAt.set(id, time.Now())
	return start, nil
}

// wake is the measured trigger: a wake-up through the Go API, cost 1, whose
// work is the bench handler; the span starts when the handler returns.
func (e *wakeEnv) wake(ctx context.Context, id string, run client.WorkflowRun) (time.Time, error) {
	_, err := e.wakeups.Create(ctx, wakeup.CreateParams{
		OrgID: wakeBenchOrg, AgentID: e.agent, WorkflowID: id, RunID: run.GetRunID(), Signal: wakeBenchSignal,
		Scope: wakeBenchScope, Reason: "bench wake", Cost: 1,
		Work: wakeup.Work{Handler: wakeBenchHandler, Args: json.RawMessage(fmt.Sprintf(`{"key":%q}`, id))},
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("wake-up for %s: %w", id, err)
	}
	return time.Time{}, nil // the span starts at the handler's return
}

// waitParked long-polls the workflow's history until its first workflow
// task completed: from then on it sits in AwaitWake.
func (e *wakeEnv) waitParked(ctx context.Context, id, runID string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	it := e.tc.GetWorkflowHistory(ctx, id, runID, true, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
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

// restEnqueue posts n wake-ups over HTTP from concurrency clients, each for
// its own (never started) workflow and with its own Idempotency-Key, as an
// agent would; it reports the wall time of the n and each request's. With
// hold, their work waits until the last answer.
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
	tag := uuid.NewString()[:8]
	post := func(ctx context.Context, i int) error {
		wf := fmt.Sprintf("%s/rest-%s-%d", wakeBenchOrg, tag, i)
		body, _ := json.Marshal(map[string]any{
			"agent_id": e.agent, "workflow_id": wf, "signal": wakeBenchSignal, "scope": wakeBenchScope,
			"reason": "bench rest", "cost": 1, "work": map[string]any{"handler": wakeBenchHandler, "args": map[string]any{"hold": hold}},
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.apiURL+"/v1/wakeups", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", wf)
		res, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusCreated {
			return fmt.Errorf("POST /v1/wakeups: %d %s", res.StatusCode, raw)
		}
		return nil
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

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
)

// REST routes `engine bench rest` measures.
const (
	RestWakeup = "wakeup" // POST /v1/wakeups
	RestSpend  = "spend"  // POST /v1/mandates/spend
	RestAppend = "append" // POST /v1/runs/{run_id}/streams/{name}/chunks
)

const (
	restOrg     = "bench-org"
	restScope   = "bench"
	restHandler = "bench"
)

// RestConfig is one `engine bench rest` run.
type RestConfig struct {
	// Service is the engine's configuration; the run replaces its
	// database and API, turns the per-org rate limit off (one org sends
	// everything: the limiter would be measured, not the route) and lifts
	// the org's pending cap past what a run reaches (the wake-ups pile up
	// in the paused wakeup pool).
	Service service.Config
	// Route is RestWakeup, RestSpend or RestAppend.
	Route string
	// Clients send requests back to back, for Duration after a warm-up of
	// Warmup; Agents spread the wake-ups and spends over that many agents
	// (each with its own mandate; 1: one hot mandate row).
	Clients, Agents  int
	Duration, Warmup time.Duration
	// Keyed sends an Idempotency-Key with every request.
	Keyed bool
	// DataDir is where a local Postgres starts when Service has no
	// database (a temporary directory when empty).
	DataDir string
	// CPUProfile, when set, is the file the route's measured phase's CPU
	// profile goes to.
	CPUProfile string
}

// restResult is one measured phase.
type restResult struct {
	n         int
	elapsed   time.Duration
	latencies []time.Duration
}

func (r restResult) line(route, extra string) string {
	return fmt.Sprintf("rest: route=%s rate=%.0f/s p50=%sms p99=%sms (n=%d in %s%s)", route,
		float64(r.n)/r.elapsed.Seconds(), wakeMS(wakePct(r.latencies, 50)), wakeMS(wakePct(r.latencies, 99)),
		r.n, r.elapsed.Round(time.Millisecond), extra)
}

// Rest measures one REST route over HTTP against the service built as
// serve builds it — Clients clients sending back to back — beside GET
// /v1/whoami in the same run (the same server, clients and machine: the
// HTTP stack's own ceiling).
func Rest(ctx context.Context, c RestConfig) error {
	switch {
	case c.Route != RestWakeup && c.Route != RestSpend && c.Route != RestAppend:
		return fmt.Errorf("unknown route %q: want %s, %s or %s", c.Route, RestWakeup, RestSpend, RestAppend)
	case c.Clients < 1 || c.Agents < 1 || c.Duration <= 0 || c.Warmup < 0:
		return errors.New("need clients ≥ 1, agents ≥ 1, duration > 0, warmup ≥ 0")
	}
	w, err := setUp(ctx, c.Service, "rest", c.DataDir, false)
	defer w.tearDown(false)
	if err != nil {
		return err
	}
	cfg, secret := serviceConfig(c.Service, w, quiet)
	cfg.API.OrgRate = 0
	// Nothing drains the paused wakeup pool while the wake-ups are
	// measured: every request leaves an item pending, and the org's cap
	// (REVEILLE_ORG_MAX_PENDING, 100,000 by default) ended a run of half a
	// minute in 429s instead of a figure. Each request still checks a cap,
	// one no run reaches.
	cfg.Workpool.MaxPendingPerOrg = math.MaxInt32
	// The bench's org operates its engine, as engine dev's does: it pauses
	// the wakeup pool and reads its own counts there.
	cfg.API.Auth.OperatorOrgs = []string{restOrg}
	cfg.Workpool.Pools = maps.Clone(cfg.Workpool.Pools)
	if cfg.Workpool.Pools == nil {
		cfg.Workpool.Pools, _ = workpool.ParsePools(workpool.DefaultPools)
	}
	// The run's wake-ups signal workflows that do not exist: their signals
	// are accepted here, so that no Temporal is needed or dialled.
	cfg.WrapSignaler = func(queue.Signaler) queue.Signaler { return discardSignals{} }
	svc, err := service.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	// (The wakeup pool is paused while the wake-ups are measured: this
	// handler runs only after the resume.)
	svc.Workpool().Register(restHandler, func(context.Context, workpool.Job) (json.RawMessage, error) { return nil, nil })
	run, err := start(ctx, svc)
	if err != nil {
		return err
	}
	defer run.stop()
	for i := range c.Agents {
		_, err := svc.Mandates().Create(ctx, restOrg, mandates.CreateParams{AgentID: restAgent(i), Scope: restScope, Budget: mandates.MaxAmount})
		if err != nil {
			return fmt.Errorf("bench mandate: %w", err)
		}
	}
	tok, err := api.SignToken(secret, api.TokenSpec{OrgID: restOrg, Sub: "bench", Roles: []string{api.RoleAgent}, TTL: time.Hour})
	if err != nil {
		return err
	}
	opTok, err := api.SignToken(secret, api.TokenSpec{OrgID: restOrg, Sub: "bench-operator", Roles: []string{api.RoleOperator, api.RoleAdmin}, TTL: time.Hour})
	if err != nil {
		return err
	}
	base := "http://" + run.addr
	operator, err := reveille.New(base, reveille.WithToken(opTok))
	if err != nil {
		return err
	}
	r := &restRunner{c: c, base: base, tag: uuid.NewString()[:8], operator: operator, hc: &http.Client{
		Timeout:   time.Minute,
		Transport: &http.Transport{MaxIdleConns: c.Clients, MaxIdleConnsPerHost: c.Clients, MaxConnsPerHost: c.Clients},
	}}
	defer r.hc.CloseIdleConnections()
	if r.api, err = reveille.New(base, reveille.WithToken(tok), reveille.WithHTTPClient(r.hc),
		reveille.WithRetry(reveille.RetryPolicy{MaxAttempts: 1})); err != nil {
		return err
	}
	return r.run(ctx)
}

func restAgent(i int) string { return fmt.Sprintf("agent-%d", i) }

// discardSignals accepts every signal.
type discardSignals struct{}

func (discardSignals) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

type restRunner struct {
	c    RestConfig
	base string
	tag  string // makes the run's workflow ids and keys its own
	hc   *http.Client
	// api makes the measured requests, as the bench's agent.
	api *reveille.Client
	seq atomic.Int64
	// operator pauses and resumes the wakeup pool over REST.
	operator *reveille.Client
}

func (r *restRunner) run(ctx context.Context) error {
	if r.c.Route == RestWakeup {
		// The wake-ups are measured with their pool paused, through the
		// pause route: a paused pool takes exactly the request path of a
		// running one (its NOTIFY included) but starts nothing, so the
		// figure is the request's alone, not the pool's work beside it.
		p, err := r.operator.Pools.Pause(ctx, wakeup.DefaultPool)
		if err != nil {
			return fmt.Errorf("pausing the %s pool: %w", wakeup.DefaultPool, err)
		}
		if !p.Paused {
			return fmt.Errorf("POST /v1/pools/%s/pause answered paused=false", wakeup.DefaultPool)
		}
	}
	for _, route := range []string{"whoami", r.c.Route} {
		if _, err := r.phase(ctx, route, r.c.Warmup); err != nil {
			return fmt.Errorf("warm-up of %s: %w", route, err)
		}
	}
	who, err := r.phase(ctx, "whoami", r.c.Duration)
	if err != nil {
		return err
	}
	groups := restGroupMetric[r.c.Route]
	sum0, count0, err := r.histogram(ctx, groups)
	if err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(r.c.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	route, err := r.phase(ctx, r.c.Route, r.c.Duration)
	if err != nil {
		return err
	}
	stopProfile()
	sum1, count1, err := r.histogram(ctx, groups)
	if err != nil {
		return err
	}
	extra := fmt.Sprintf(", clients=%d agents=%d keyed=%t", r.c.Clients, r.c.Agents, r.c.Keyed)
	if count1 > count0 {
		extra += fmt.Sprintf(", %.1f requests per shared commit", (sum1-sum0)/(count1-count0))
	}
	if r.c.Route == RestWakeup {
		held, err := r.resume(ctx)
		if err != nil {
			return err
		}
		extra += held
	}
	fmt.Println(who.line("whoami", fmt.Sprintf(", clients=%d", r.c.Clients)))
	fmt.Println(route.line(r.c.Route, extra))
	return nil
}

// resume checks that the paused wakeup pool started none of the run's
// wake-ups, and resumes it; it describes what waited.
func (r *restRunner) resume(ctx context.Context) (string, error) {
	p, err := r.operator.Pools.Get(ctx, wakeup.DefaultPool)
	if err != nil {
		return "", fmt.Errorf("reading the %s pool: %w", wakeup.DefaultPool, err)
	}
	if !p.Paused || p.Running > 0 {
		return "", fmt.Errorf("the %s pool started work while paused (paused=%t running=%d)", wakeup.DefaultPool, p.Paused, p.Running)
	}
	if _, err := r.operator.Pools.Resume(ctx, wakeup.DefaultPool); err != nil {
		return "", fmt.Errorf("resuming the %s pool: %w", wakeup.DefaultPool, err)
	}
	return fmt.Sprintf(", %s pool paused (%d items waited)", wakeup.DefaultPool, p.Pending), nil
}

// restGroupMetric is the histogram of requests per shared commit of each
// route that groups them.
var restGroupMetric = map[string]string{
	RestWakeup: "reveille_wakeups_create_batch_size",
	RestSpend:  "reveille_mandates_spend_batch_size",
}

// histogram reads the sum and count of a histogram from /metrics (zeros
// for "" or a histogram not there).
func (r *restRunner) histogram(ctx context.Context, name string) (sum, count float64, err error) {
	if name == "" {
		return 0, 0, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	res, err := r.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, 0, err
	}
	if res.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET /metrics: %d %s", res.StatusCode, raw)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+"_sum "); ok {
			sum, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, name+"_count "); ok {
			count, _ = strconv.ParseFloat(v, 64)
		}
	}
	return sum, count, nil
}

// phase sends route requests from every client, back to back, for d.
func (r *restRunner) phase(ctx context.Context, route string, d time.Duration) (restResult, error) {
	if d <= 0 {
		return restResult{}, nil
	}
	began := time.Now()
	deadline := began.Add(d)
	lat := make([][]time.Duration, r.c.Clients)
	errc := make(chan error, r.c.Clients)
	var wg sync.WaitGroup
	for client := range r.c.Clients {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if err := r.send(ctx, route, client); err != nil {
					errc <- err
					return
				}
				lat[client] = append(lat[client], time.Since(t))
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return restResult{}, err
	}
	res := restResult{elapsed: time.Since(began)}
	for _, l := range lat {
		res.latencies = append(res.latencies, l...)
	}
	res.n = len(res.latencies)
	fmt.Fprintf(os.Stderr, "bench rest: %s: %d requests in %s\n", route, res.n, res.elapsed.Round(time.Millisecond))
	return res, ctx.Err()
}

// send makes one request of route as client through the typed client, as
// a platform would (its answer decoded; an error status is an error). Each
// request is one attempt (r.api retries nothing), so that a latency is a
// request's.
func (r *restRunner) send(ctx context.Context, route string, client int) error {
	i := r.seq.Add(1)
	agent := restAgent(int(i) % r.c.Agents)
	key := reveille.WithoutIdempotencyKey()
	if r.c.Keyed {
		key = reveille.WithIdempotencyKey(fmt.Sprintf("rest-%s-%d", r.tag, i))
	}
	var err error
	switch route {
	case "whoami":
		_, err = r.api.Whoami(ctx)
	case RestWakeup:
		_, err = r.api.Wakeups.Create(ctx, reveille.WakeupRequest{
			AgentID: agent, WorkflowID: fmt.Sprintf("%s/rest-%s-%d", restOrg, r.tag, i), Signal: "wake",
			Scope: restScope, Reason: "bench rest", Cost: 1, Work: reveille.WakeupWork{Handler: restHandler},
		}, key)
	case RestSpend:
		_, err = r.api.Mandates.Spend(ctx, reveille.SpendRequest{AgentID: agent, Scope: restScope, Cost: 1, Reason: "bench rest"}, key)
	case RestAppend:
		_, err = r.api.Streams.Append(ctx, fmt.Sprintf("rest-%s-%d", r.tag, client), "out",
			[]byte("a chunk of bench output, 48 bytes long........\n"), key)
	default:
		err = fmt.Errorf("no route %q", route)
	}
	return err
}

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/reveille/reveille/internal/bench"
)

// benches are the `engine bench <name>` benchmarks: each parses its flags
// and runs internal/bench's.
var benches = map[string]func(ctx context.Context, s settings, args []string) error{
	"pool":    benchPool,
	"rest":    benchRest,
	"spend":   benchSpend,
	"streams": benchStreams,
	"wake":    benchWake,
}

func runBench(ctx context.Context, args []string) error {
	if len(args) > 0 && slices.Contains([]string{"-h", "-help", "--help"}, args[0]) {
		// Help is asked for, not a mistake: the list of benchmarks on
		// stderr and exit 0, as every other command's --help.
		fmt.Fprintf(os.Stderr, "Usage: %s\n\nBenchmarks (engine bench <name> --help for each one's flags; docs/benchmarks.md):\n  %s\n",
			benchSynopsis(), strings.Join(benchNames(), "\n  "))
		return flag.ErrHelp
	}
	if len(args) == 0 || benches[args[0]] == nil {
		return errors.New("usage: " + benchSynopsis())
	}
	s, err := envConfig()
	if err != nil && !asksForHelp(args[1:]) {
		return err
	}
	return benches[args[0]](ctx, s, args[1:])
}

// asksForHelp reports whether args ask for the usage (-h, -help, --help),
// which a command prints whatever the environment holds.
func asksForHelp(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}

// benchSynopsis is engine bench's usage line.
func benchSynopsis() string {
	return fmt.Sprintf("engine bench <%s> [flags]", strings.Join(benchNames(), "|"))
}

// benchUsage prints a benchmark's usage: what it uses, then its flags.
func benchUsage(fs *flag.FlagSet, synopsis, about string) func() {
	return func() {
		fmt.Fprintf(os.Stderr, "Usage: %s\n\n%s\nFlags:\n", synopsis, about)
		fs.PrintDefaults()
	}
}

// localPostgres is what the pool, spend and streams benchmarks say of
// their database.
const localPostgres = `Uses DATABASE_URL, or else starts a local Postgres (default, durable settings),
and runs in a fresh database created beside it and dropped at the end.
`

func benchPool(ctx context.Context, s settings, args []string) error {
	fs := flag.NewFlagSet("bench pool", flag.ContinueOnError)
	c := bench.PoolConfig{Service: s.serviceConfig(nil)}
	fs.IntVar(&c.N, "n", 50000, "work items")
	fs.IntVar(&c.Parallelism, "parallelism", 100, "the pool's max_parallelism")
	fs.IntVar(&c.Batch, "batch", 1000, "items per EnqueueMany")
	fs.BoolVar(&c.Hook, "hook", true, "give every item an onComplete hook")
	fs.StringVar(&c.DataDir, "data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the burn-down to this file")
	fs.IntVar(&c.Orgs, "orgs", 1, "with 2 or more (at most --n: each org gets one item at least): time the n items spread over this many orgs (fair share) beside one org's, in --rounds pairs")
	fs.IntVar(&c.Rounds, "rounds", 2, "with --orgs: pairs of burn-downs (one org, then the orgs; the order alternates); medians are printed")
	fs.Usage = benchUsage(fs, "engine bench pool [flags]", localPostgres)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return bench.Pool(ctx, c)
}

func benchSpend(ctx context.Context, s settings, args []string) error {
	fs := flag.NewFlagSet("bench spend", flag.ContinueOnError)
	c := bench.SpendConfig{Service: s.serviceConfig(nil)}
	fs.IntVar(&c.Clients, "clients", 16, "concurrent clients")
	fs.IntVar(&c.N, "n", 20000, "spends in all")
	fs.IntVar(&c.Mandates, "mandates", 64, "mandates (agent, scope) the spends are spread over; 1 = one hot row")
	fs.BoolVar(&c.Keyed, "keyed", true, "give every spend an idempotency key, as the wake-up path does")
	fs.IntVar(&c.Batch, "batch", 64, "most concurrent spends one commit carries (mandates.Config.MaxSpendBatch; 1: a commit per spend)")
	fs.StringVar(&c.DataDir, "data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	fs.Usage = benchUsage(fs, "engine bench spend [flags]", localPostgres)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return bench.Spend(ctx, c)
}

func benchStreams(ctx context.Context, s settings, args []string) error {
	fs := flag.NewFlagSet("bench streams", flag.ContinueOnError)
	c := bench.StreamsConfig{Service: s.serviceConfig(nil)}
	fs.IntVar(&c.Writers, "writers", 8, "concurrent writers, each to its own stream")
	fs.IntVar(&c.Chunks, "chunks", 20000, "chunks to append in all")
	fs.IntVar(&c.Size, "size", 256, "bytes per chunk")
	fs.IntVar(&c.Batch, "batch", 50, "chunks per append (1: one chunk per transaction)")
	fs.IntVar(&c.Rounds, "rounds", 3, "alternating rounds of both runs; medians are reported")
	fs.StringVar(&c.DataDir, "data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the measured rounds to this file")
	fs.Usage = benchUsage(fs, "engine bench streams [flags]", localPostgres)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return bench.Streams(ctx, c)
}

func benchWake(ctx context.Context, s settings, args []string) error {
	fs := flag.NewFlagSet("bench wake", flag.ContinueOnError)
	// The REST phase's signals to absent workflows end as warnings,
	// thousands of them; unless told otherwise, only errors are logged.
	c := bench.WakeConfig{Service: s.serviceConfig(newLogger(cmp.Or(s.LogLevel, "error")))}
	fs.IntVar(&c.N, "n", 1000, "measured wakes (and as many bare signals)")
	fs.IntVar(&c.Concurrency, "concurrency", 50, "workflows in flight at once, for both the wake and the bare-signal runs")
	fs.IntVar(&c.RestN, "rest-n", 2000, "POST /v1/wakeups requests for the REST enqueue rate (0 skips it)")
	fs.BoolVar(&c.Together, "together", true, "run the bare-signal and the wake side at the same time, each at --concurrency, so that a drift in the (shared) machine's load hits both alike; false: one after the other, in --rounds")
	fs.IntVar(&c.Rounds, "rounds", 2, "with --together=false: rounds the n are split over, each a bare-signal run and a wake run, which goes first alternating")
	fs.BoolVar(&c.RestHold, "rest-hold", true, "hold the REST wake-ups' work until their requests are all answered: their signals go to workflows that never exist and are retried until the NotFound grace ends, several sends each, load that production (one send per wake-up) does not have")
	fs.BoolVar(&c.Keep, "keep", false, "keep the run's database and the temporary directory of the local Postgres and Temporal (their names are printed)")
	fs.DurationVar(&c.Settle, "settle", 100*time.Millisecond, "pause between a workflow parking and its trigger, on both sides, so that neither lands on the tail of Temporal's work for the parking task")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the measured rounds to this file")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, `Usage: engine bench wake [flags]

Uses DATABASE_URL and TEMPORAL_ADDRESS (TEMPORAL_NAMESPACE) when set, or else
starts a local Postgres (durable settings) and an embedded Temporal in a
temporary directory; runs in a fresh database created beside DATABASE_URL's
and dropped at the end. Builds the engine through the same wiring as serve,
with a handler "bench" that returns at once, and parks workflows (ids
bench-org/wake-<i>, bench-org/signal-<i>) on a task queue of their own.

Prints:
  signal: n=… p50=…ms p99=…ms max=…ms   bare SignalWorkflow → run.Get returns
  wake: n=… p50=…ms p99=…ms max=…ms     handler returns → run.Get returns
  the ratios wake/signal at p50 and p99, each side split into stages,
  rest enqueue: n=… rate=…/s            POST /v1/wakeups, concurrency clients

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return bench.Wake(ctx, c)
}

func benchRest(ctx context.Context, s settings, args []string) error {
	fs := flag.NewFlagSet("bench rest", flag.ContinueOnError)
	c := bench.RestConfig{Service: s.serviceConfig(nil)}
	fs.StringVar(&c.Route, "route", bench.RestWakeup, "the route measured: wakeup (POST /v1/wakeups), spend (POST /v1/mandates/spend) or append (POST …/streams/{name}/chunks)")
	fs.IntVar(&c.Clients, "clients", 32, "concurrent clients, each sending its next request when its last is answered")
	fs.IntVar(&c.Agents, "agents", 16, "agents (each with its own mandate) the wake-ups and spends are spread over; 1 = one hot mandate row")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long each measured phase (whoami, then the route) runs")
	fs.DurationVar(&c.Warmup, "warmup", 2*time.Second, "how long each phase is warmed up first, unmeasured")
	fs.BoolVar(&c.Keyed, "keyed", false, "send an Idempotency-Key with every request")
	fs.StringVar(&c.DataDir, "data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the route's measured phase to this file")
	fs.Usage = benchUsage(fs, "engine bench rest [flags]", localPostgres+`Builds the engine as serve does (no Temporal: the wake-ups' signals are
accepted in process), with the per-org rate limit off; the wake-ups are
measured with the wakeup pool paused through POST /v1/pools/wakeup/pause
(resumed at the end). It prints
  rest: route=whoami rate=…/s p50=…ms p99=…ms   GET /v1/whoami, the same clients
  rest: route=<route> rate=…/s p50=…ms p99=…ms
`)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return bench.Rest(ctx, c)
}

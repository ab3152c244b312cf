package leader

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/startstop"
	"github.com/reveille/reveille/internal/testkit"
)

func TestBackgroundRunsTheElectionUntilStopAndStartsOnce(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	e := &Elector{DB: testkit.NewPoolFor(t, dsn), Name: "test.background", Retry: 50 * time.Millisecond, Logger: testkit.Logger(t)}
	var b Background
	require.NoError(t, b.Stop(context.Background()), "stopping what never started is safe")

	led, ended := make(chan struct{}), make(chan struct{})
	require.NoError(t, b.Start(context.Background(), e, func(ctx context.Context) {
		close(led)
		<-ctx.Done()
		close(ended)
	}))
	err := b.Start(context.Background(), e, func(context.Context) {})
	require.ErrorIs(t, err, startstop.ErrStarted)
	require.EqualError(t, err, "test.background: already started", "named after the leadership")
	<-led

	require.NoError(t, b.Stop(context.Background()))
	select {
	case <-ended:
	default:
		t.Fatal("Stop returned before the leader's fn did")
	}
	require.NoError(t, b.Stop(context.Background()), "stopping twice is safe")
}

func TestEveryRunsARoundAtOnceAndReportsOnlyLiveFailures(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var rounds atomic.Int32
	var reported []error
	boom := errors.New("boom")
	fn := Every(time.Hour, func(ctx context.Context) error {
		if rounds.Add(1) == 1 {
			cancel() // the first round fails as its context ends: not a failure to report
			return ctx.Err()
		}
		return boom
	}, func(err error) { reported = append(reported, err) })

	fn(ctx) // returns once its context ended, after the first round

	require.EqualValues(t, 1, rounds.Load(), "the first round runs at once, not after the interval")
	require.Empty(t, reported)

	ctx2, cancel2 := context.WithCancel(context.Background())
	fn2 := Every(time.Millisecond, func(context.Context) error {
		if rounds.Add(1) == 4 {
			cancel2()
		}
		return boom
	}, func(err error) { reported = append(reported, err) })
	fn2(ctx2)
	require.Equal(t, []error{boom, boom}, reported, "failures of live rounds are reported; the one that ended it is not")
}

func TestSweepBatchesDrainsUntilAShortBatch(t *testing.T) {
	ctx := context.Background()
	backlog := []int{1, 2, 3, 4, 5} // 5 due items, batches of 2
	var logged []int
	scan := func(_ context.Context, after *int, n int) ([]int, error) { return backlog[:min(n, len(backlog))], nil }
	handle := func(_ context.Context, d int) (bool, error) {
		backlog = backlog[1:]
		return d != 4, nil // 4 no longer needed handling
	}
	n, err := SweepBatches(ctx, 2, scan, handle, func(d int, err error) { logged = append(logged, d) })
	require.NoError(t, err)
	require.Equal(t, 4, n, "five handled, four counted, through a short last batch")
	require.Empty(t, logged)
}

// Items that keep failing stay due; a sweep that scanned from the oldest
// again would meet them first every time, and a batch's worth of them
// would hold up everything behind them.
func TestSweepBatchesGoesOnPastItemsThatFail(t *testing.T) {
	ctx := context.Background()
	due := []int{1, 2, 3, 4, 5, 6, 7} // 1–4 fail and stay due
	var afters []any
	scan := func(_ context.Context, after *int, n int) ([]int, error) {
		afters = append(afters, after)
		from := 0
		if after != nil {
			afters[len(afters)-1] = *after
			for from < len(due) && due[from] <= *after {
				from++
			}
		}
		return due[from:min(from+n, len(due))], nil
	}
	handle := func(_ context.Context, d int) (bool, error) {
		if d <= 4 {
			return false, errors.New("boom")
		}
		return true, nil
	}
	var logged []int
	n, err := SweepBatches(ctx, 2, scan, handle, func(d int, err error) { logged = append(logged, d) })
	require.NoError(t, err)
	require.Equal(t, 3, n, "5, 6 and 7 handled behind four failures")
	require.Equal(t, []int{1, 2, 3, 4}, logged)
	require.Equal(t, []any{(*int)(nil), 2, 4, 6}, afters, "each scan after the last item of the one before")
}

// Every leader task's failure counter shares one metric name, told apart
// by its task label: all of them register on one registry (the service's)
// and each is there at 0 from the start.
func TestEveryTasksErrorCounterRegistersOnOneRegistryAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	tasks := []string{"approvals.sweeper", "mandates.sweeper", "wakeup.reconciler", "streams.retention", "retention"}
	for _, task := range tasks {
		require.NoError(t, reg.Register(NewTaskErrors(task)), task)
	}
	require.Error(t, reg.Register(NewTaskErrors("retention")), "a task registered twice clashes")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP reveille_leader_task_errors_total Failures of a leader-only task (a round, or one item of a sweep), by task (the leadership's name).
# TYPE reveille_leader_task_errors_total counter
reveille_leader_task_errors_total{task="approvals.sweeper"} 0
reveille_leader_task_errors_total{task="mandates.sweeper"} 0
reveille_leader_task_errors_total{task="retention"} 0
reveille_leader_task_errors_total{task="streams.retention"} 0
reveille_leader_task_errors_total{task="wakeup.reconciler"} 0
`), "reveille_leader_task_errors_total"))
}

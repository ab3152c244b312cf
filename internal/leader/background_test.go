package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

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

func TestSweepBatchesDrainsUntilAShortBatchAndStopsWhenAWholeBatchFails(t *testing.T) {
	ctx := context.Background()
	backlog := []int{1, 2, 3, 4, 5} // 5 due items, batches of 2
	var logged []int
	scan := func(_ context.Context, n int) ([]int, error) { return backlog[:min(n, len(backlog))], nil }
	handle := func(_ context.Context, d int) (bool, error) {
		backlog = backlog[1:]
		return d != 4, nil // 4 no longer needed handling
	}
	n, err := SweepBatches(ctx, 2, scan, handle, func(d int, err error) { logged = append(logged, d) })
	require.NoError(t, err)
	require.Equal(t, 4, n, "five handled, four counted, through a short last batch")
	require.Empty(t, logged)

	scans := 0
	failing := func(_ context.Context, n int) ([]int, error) { scans++; return []int{7, 8}, nil }
	n, err = SweepBatches(ctx, 2, failing, func(context.Context, int) (bool, error) { return false, errors.New("boom") },
		func(d int, err error) { logged = append(logged, d) })
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, scans, "a batch that failed whole is not scanned again at once")
	require.Equal(t, []int{7, 8}, logged)
}

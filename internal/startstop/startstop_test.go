package startstop

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// untilCanceled is a service body that records that it ran and returns
// when its context ends.
func untilCanceled(ran chan<- struct{}) func(context.Context) {
	return func(ctx context.Context) {
		close(ran)
		<-ctx.Done()
	}
}

func TestAServiceStartsOnceInItsLife(t *testing.T) {
	tests := []struct {
		name   string
		before func(b *Base) // what happened before the Start under test
	}{
		{"while running", func(b *Base) {}},
		{"after Stop", func(b *Base) { require.NoError(t, b.Stop(context.Background())) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Base
			ran := make(chan struct{})
			require.NoError(t, b.Start(context.Background(), "test service", untilCanceled(ran)))
			<-ran
			tt.before(&b)
			err := b.Start(context.Background(), "test service", func(context.Context) { t.Error("a second start ran") })
			require.ErrorIs(t, err, ErrStarted)
			require.EqualError(t, err, "test service: already started")
			require.NoError(t, b.Stop(context.Background()))
		})
	}
}

func TestStopCancelsTheServiceAndWaitsForItsGoroutine(t *testing.T) {
	var b Base
	ran, returned := make(chan struct{}), make(chan struct{})
	require.NoError(t, b.Start(context.Background(), "test service", func(ctx context.Context) {
		defer close(returned)
		untilCanceled(ran)(ctx)
	}))
	<-ran
	require.True(t, b.Running())
	require.NoError(t, b.Stop(context.Background()))
	select {
	case <-returned:
	default:
		t.Fatal("Stop returned before the service's goroutine did")
	}
	require.False(t, b.Running())
	<-b.Stopped()
	require.NoError(t, b.Stop(context.Background()), "stopping twice is a no-op")
}

func TestStoppingAServiceNeverStartedIsANoOp(t *testing.T) {
	var b Base
	require.NoError(t, b.Stop(context.Background()))
	require.NoError(t, b.Stop(context.Background()))
	require.False(t, b.Running())
	<-b.Stopped() // closed: nothing runs
	ran := make(chan struct{})
	require.NoError(t, b.Start(context.Background(), "test service", untilCanceled(ran)), "a Stop before Start does not use up the start")
	<-ran
	require.NoError(t, b.Stop(context.Background()))
}

func TestStopIsBoundedByItsContextAndNamesTheService(t *testing.T) {
	var b Base
	release, ran := make(chan struct{}), make(chan struct{})
	require.NoError(t, b.Start(context.Background(), "stubborn service", func(context.Context) {
		close(ran)
		<-release // ignores its context
	}))
	<-ran
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := b.Stop(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualError(t, err, "stubborn service: stopping: context canceled")
	close(release)
	require.NoError(t, b.Stop(context.Background()), "a second Stop waits for the goroutine")
	<-b.Stopped()
}

func TestTheEndOfStartsContextEndsTheService(t *testing.T) {
	var b Base
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	require.NoError(t, b.Start(ctx, "test service", untilCanceled(ran)))
	<-ran
	cancel()
	<-b.Stopped()
	require.False(t, b.Running())
	require.NoError(t, b.Stop(context.Background()))
}

func TestAFailedOpenLeavesTheServiceUnstartedAndNamesTheError(t *testing.T) {
	var b Base
	boom := errors.New("connect refused")
	err := b.StartWith(context.Background(), "test service", func(context.Context) (func(context.Context), error) {
		return nil, boom
	})
	require.ErrorIs(t, err, boom)
	require.EqualError(t, err, "test service: connect refused")
	require.False(t, b.Running())
	require.NoError(t, b.Stop(context.Background()))

	ran := make(chan struct{})
	require.NoError(t, b.StartWith(context.Background(), "test service", func(context.Context) (func(context.Context), error) {
		return untilCanceled(ran), nil
	}), "a failed start may be retried")
	<-ran
	require.True(t, b.Running())
	require.NoError(t, b.Stop(context.Background()))
}

// A Stop that arrives while open runs cancels open's context, waits for
// it, and still hands run what open acquired, so that it is released.
func TestAStopDuringOpenWaitsForItAndRunStillReleases(t *testing.T) {
	var b Base
	opening, released := make(chan struct{}), make(chan struct{})
	started := make(chan error, 1)
	go func() {
		started <- b.StartWith(context.Background(), "test service", func(ctx context.Context) (func(context.Context), error) {
			close(opening)
			<-ctx.Done() // open notices the Stop and finishes anyway
			return func(ctx context.Context) {
				<-ctx.Done()
				close(released)
			}, nil
		})
	}()
	<-opening
	require.NoError(t, b.Stop(context.Background()))
	select {
	case <-released:
	default:
		t.Fatal("Stop returned before run released what open acquired")
	}
	require.NoError(t, <-started)
	require.False(t, b.Running())
	require.ErrorIs(t, b.Start(context.Background(), "test service", func(context.Context) {}), ErrStarted)
}

// Many goroutines start and stop one service at once: exactly one start
// wins, every Stop returns, and nothing is left running (run with -race).
func TestConcurrentStartsAndStopsAreSafe(t *testing.T) {
	for range 50 {
		var b Base
		var wg sync.WaitGroup
		var mu sync.Mutex
		started := 0
		for range 4 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				err := b.Start(context.Background(), "test service", func(ctx context.Context) { <-ctx.Done() })
				if err == nil {
					mu.Lock()
					started++
					mu.Unlock()
				} else if !errors.Is(err, ErrStarted) {
					t.Errorf("unexpected start error: %v", err)
				}
			}()
			go func() {
				defer wg.Done()
				if err := b.Stop(context.Background()); err != nil {
					t.Errorf("stop: %v", err)
				}
			}()
		}
		wg.Wait()
		require.NoError(t, b.Stop(context.Background()))
		<-b.Stopped()
		require.Equal(t, 1, started, "the first Start wins; a Stop before it is a no-op, one after it ends the service's life")
		require.False(t, b.Running())
	}
}

// Whoever sees a service no longer running sees its context canceled: a
// dispatcher told the test "stopped" (Running false) before its context
// ended, and a send waiting for a slot took one freed in between, as if
// no stop had come.
func TestAServiceSeenStoppedHasItsContextCanceled(t *testing.T) {
	for range 2000 {
		var b Base
		ctxc := make(chan context.Context, 1)
		require.NoError(t, b.Start(context.Background(), "test service", func(ctx context.Context) {
			ctxc <- ctx
			<-ctx.Done()
		}))
		ctx := <-ctxc
		stopped := make(chan error, 1)
		go func() { stopped <- b.Stop(context.Background()) }()
		for b.Running() {
		}
		require.Error(t, ctx.Err(), "not running, its context not canceled")
		require.NoError(t, <-stopped)
	}
}

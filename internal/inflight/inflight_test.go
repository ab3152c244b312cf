package inflight

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWaitWithNothingUnderWayReturnsAtOnce(t *testing.T) {
	var s Set
	require.NoError(t, s.Wait(context.Background()))
}

func TestWaitReturnsOnceTheGoroutinesUnderWayHaveReturned(t *testing.T) {
	var s Set
	release := make(chan struct{})
	var returned atomic.Bool
	s.Go(func(context.Context) {
		<-release
		returned.Store(true)
	})
	go close(release)
	require.NoError(t, s.Wait(context.Background()))
	require.True(t, returned.Load())
}

func TestWaitPastItsContextCancelsTheGoroutinesAndWaitsForThemToReturn(t *testing.T) {
	var s Set
	var canceled atomic.Bool
	started := make(chan struct{})
	s.Go(func(ctx context.Context) {
		close(started)
		<-ctx.Done() // (a statement canceled with its context)
		canceled.Store(true)
	})
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Wait(ctx), context.Canceled)
	require.True(t, canceled.Load(), "Wait returned once the goroutine it canceled had returned")
}

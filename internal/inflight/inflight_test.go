package inflight

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitWithNothingUnderWayReturnsAtOnce(t *testing.T) {
	var s Set
	require.NoError(t, s.Wait(context.Background()))
}

func TestWaitReturnsOnceTheRunsUnderWayHaveEnded(t *testing.T) {
	var s Set
	_, end := s.Begin(time.Hour)
	waited := make(chan error, 1)
	go func() { waited <- s.Wait(context.Background()) }()
	select {
	case <-waited:
		t.Fatal("Wait returned with a run under way")
	case <-time.After(50 * time.Millisecond):
	}
	end()
	require.NoError(t, <-waited)
}

func TestWaitPastItsContextCancelsTheRunsAndWaitsForThemToEnd(t *testing.T) {
	var s Set
	runCtx, end := s.Begin(time.Hour)
	var canceled atomic.Bool
	go func() {
		<-runCtx.Done() // (a statement canceled with its context)
		canceled.Store(true)
		end()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Wait(ctx), context.Canceled)
	require.True(t, canceled.Load(), "Wait returned once the run it canceled had ended")
}

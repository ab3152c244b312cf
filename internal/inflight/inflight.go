// Package inflight tracks the goroutines a service starts on its callers'
// behalf (the drains that run batches of spends, groups of wake-up
// requests), so that its Stop can wait for them: one that outlived Stop
// would hold a connection of a pool about to close, and commit after the
// service said it had stopped.
package inflight

import (
	"context"
	"sync"
)

// Set is the goroutines under way. The zero value is ready.
type Set struct {
	mu   sync.Mutex
	runs map[*run]struct{}
}

type run struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Go runs fn in a goroutine of the set's. fn's context ends when a Wait
// gives up on it.
func (s *Set) Go(fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[*run]struct{}{}
	}
	s.runs[r] = struct{}{}
	s.mu.Unlock()
	go func() {
		defer func() {
			cancel()
			s.mu.Lock()
			delete(s.runs, r)
			s.mu.Unlock()
			close(r.done)
		}()
		fn(ctx)
	}()
}

// Wait waits for the goroutines under way when it is called to return.
// When ctx ends first it cancels their contexts, waits for them to return
// (a canceled statement returns at once), and returns ctx's error.
// Goroutines started after the call are not waited for.
func (s *Set) Wait(ctx context.Context) error {
	s.mu.Lock()
	runs := make([]*run, 0, len(s.runs))
	for r := range s.runs {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	var err error
	for _, r := range runs {
		select {
		case <-r.done:
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
				for _, c := range runs {
					c.cancel()
				}
			}
			<-r.done
		}
	}
	return err
}

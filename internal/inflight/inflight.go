// Package inflight tracks the runs a service makes in goroutines of its
// own on its callers' behalf (a batch of spends, a group of wake-up
// requests), so that its Stop can wait for them: a run that outlived Stop
// would hold a connection of a pool about to close, and commit after the
// service said it had stopped.
package inflight

import (
	"context"
	"sync"
	"time"
)

// Set is the runs under way. The zero value is ready.
type Set struct {
	mu   sync.Mutex
	runs map[*run]struct{}
}

type run struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Begin registers a run and returns the context it goes under (ending
// after timeout, or when Wait gives up on it) and the function that ends
// it.
func (s *Set) Begin(timeout time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	r := &run{cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if s.runs == nil {
		s.runs = map[*run]struct{}{}
	}
	s.runs[r] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		cancel()
		s.mu.Lock()
		delete(s.runs, r)
		s.mu.Unlock()
		close(r.done)
	}
}

// Wait waits for the runs under way when it is called to end. When ctx
// ends first it cancels them, waits for them to end (a canceled statement
// returns at once), and returns ctx's error.
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

package leader

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStarted is returned by Background.Start when it is already running.
var ErrStarted = errors.New("already started")

// Background runs an Elector in a goroutine of its own, for a service's
// Start and Stop: Start returns at once, Stop cancels the election (a
// leader's fn sees its context end) and waits for it. The zero value is
// ready to use; stopping twice, or without Start, is safe.
type Background struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs e.Run(ctx, fn) in the background until Stop (or ctx ends).
func (b *Background) Start(ctx context.Context, e *Elector, fn func(context.Context)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	b.cancel, b.done = cancel, done
	go func() {
		defer close(done)
		e.Run(ctx, fn)
	}()
	return nil
}

// Stop ends the election and waits for it to return, or for ctx to end
// (then ctx's error).
func (b *Background) Stop(ctx context.Context) error {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every returns a leader's fn that calls round at once and then every
// interval until its context ends. A round's error goes to onError unless
// the context ended (leadership lost or stopping: not a failure).
func Every(interval time.Duration, round func(context.Context) error, onError func(error)) func(context.Context) {
	return func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if err := round(ctx); err != nil && ctx.Err() == nil {
				onError(err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
}

// SweepBatches drains a backlog batch by batch: scan returns up to batch
// due items, each is handled alone (true: it counted, false: it no longer
// needed handling), and a failure is logged through onError and left for
// the next sweep. It stops when a batch comes back short, or when every
// item of a batch failed (those failures would only be met again at once),
// and returns how many items counted.
func SweepBatches[T any](ctx context.Context, batch int, scan func(context.Context, int) ([]T, error),
	handle func(context.Context, T) (bool, error), onError func(T, error)) (int, error) {
	total := 0
	for {
		due, err := scan(ctx, batch)
		if err != nil {
			return total, err
		}
		failed := 0
		for _, d := range due {
			counted, err := handle(ctx, d)
			if err != nil {
				if ctx.Err() != nil {
					return total, ctx.Err()
				}
				failed++
				onError(d, err)
				continue
			}
			if counted {
				total++
			}
		}
		if len(due) < batch || failed == len(due) {
			return total, nil
		}
	}
}

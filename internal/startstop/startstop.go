// Package startstop is the one lifecycle of Reveille's background services
// (dispatcher, sweepers, reconciler, hub, retention, purge), after River's
// rivershared/startstop: a service starts once, runs its goroutine until
// Stop (or until the context given to Start ends), and Stop cancels it and
// waits for it. Errors name the service: "<name>: ...".
//
// A service holds a Base and writes a two-line Start and Stop:
//
//	func (d *Dispatcher) Start(ctx context.Context) error { return d.life.Start(ctx, "queue dispatcher", d.run) }
//	func (d *Dispatcher) Stop(ctx context.Context) error  { return d.life.Stop(ctx) }
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStarted is returned, wrapped with the service's name, by a Start after
// the first successful one: a service starts once in its life, even after
// Stop (what it handed out, such as subscriptions, ended for good).
var ErrStarted = errors.New("already started")

type state int

const (
	idle     state = iota // never started, or its start failed
	starting              // open is running
	running
	stopped
)

// Base is the lifecycle a service embeds as a field. The zero value is
// ready to use; Stop without Start, or twice, is a no-op (a second Stop
// still waits for the service's goroutine, bounded by its own ctx).
type Base struct {
	mu      sync.Mutex
	name    string
	state   state
	cancel  context.CancelFunc
	stopped chan struct{} // closed once the service's goroutine returned
}

// Start runs run in a goroutine of its own, with a context that ends at
// Stop or when ctx ends; it returns at once.
func (b *Base) Start(ctx context.Context, name string, run func(ctx context.Context)) error {
	return b.StartWith(ctx, name, func(context.Context) (func(context.Context), error) { return run, nil })
}

// StartWith is Start for a service that must do something before Start
// returns (connect, LISTEN): open runs synchronously, with the service's
// context, and returns what then runs in the background. If open fails the
// service is as if never started (Start may be called again) and its error
// comes back named. run owns what open acquired: it must release it when
// its context ends, even at once.
func (b *Base) StartWith(ctx context.Context, name string, open func(ctx context.Context) (run func(ctx context.Context), err error)) error {
	b.mu.Lock()
	if b.state != idle {
		b.mu.Unlock()
		return fmt.Errorf("%s: %w", name, ErrStarted)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	b.name, b.state, b.cancel, b.stopped = name, starting, cancel, done
	b.mu.Unlock()

	run, err := open(sctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		cancel()
		close(done)
		if b.state == starting { // a Stop meanwhile keeps it stopped
			b.state = idle
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	if b.state == starting {
		b.state = running
	}
	// Even when a Stop came during open, run gets its (canceled) context:
	// it releases what open acquired.
	go func() {
		defer close(done)
		defer cancel()
		run(sctx)
	}()
	return nil
}

// Stop cancels the service's context and waits for its goroutine to
// return, or for ctx to end (then a named error wrapping ctx's). Stopping a
// service never started, or stopped, is a no-op.
func (b *Base) Stop(ctx context.Context) error {
	b.mu.Lock()
	if b.state == idle {
		b.mu.Unlock()
		return nil
	}
	b.state = stopped
	name, done := b.name, b.stopped
	// (under the lock: whoever sees the service not running sees its
	// context canceled, or a dispatcher's send waiting for a slot could
	// take one as if no stop had come)
	b.cancel()
	b.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: stopping: %w", name, ctx.Err())
	}
}

// Running reports whether the service has started (open succeeded), has
// not been told to stop, and its goroutine has not returned (its Start
// context may have ended).
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != running {
		return false
	}
	select {
	case <-b.stopped:
		return false
	default:
		return true
	}
}

// Stopped returns a channel closed once the service's goroutine has
// returned; for a service not started it is closed already.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return b.stopped
}

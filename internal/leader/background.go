package leader

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/startstop"
)

// NewTaskErrors returns the counter of a leader task's failures,
// reveille_leader_task_errors_total{task}, for its owner to register beside
// its own metrics and add to wherever it logs a failure (a round's and an
// item's alike). task is the leadership's name ("mandates.sweeper"): one
// series per task, there at 0 from the start. A leader-only task that
// keeps failing is otherwise seen only in WARN lines, on whichever replica
// leads.
func NewTaskErrors(task string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "reveille_leader_task_errors_total",
		Help:        "Failures of a leader-only task (a round, or one item of a sweep), by task (the leadership's name).",
		ConstLabels: prometheus.Labels{"task": task},
	})
}

// Background runs an Elector as a service (internal/startstop): Start
// returns at once, Stop cancels the election (a leader's fn sees its
// context end) and waits for it. Errors are named after the leadership. The
// zero value is ready to use; it starts once, and stopping twice, or
// without Start, is safe.
type Background struct{ life startstop.Base }

// Start runs e.Run(ctx, fn) in the background until Stop (or ctx ends).
func (b *Background) Start(ctx context.Context, e *Elector, fn func(context.Context)) error {
	return b.life.Start(ctx, e.Name, func(ctx context.Context) { e.Run(ctx, fn) })
}

// Stop ends the election and waits for it to return, or for ctx to end.
func (b *Background) Stop(ctx context.Context) error { return b.life.Stop(ctx) }

// Every returns a leader's fn that calls round at once and then every
// interval until its context ends. A round's error goes to onError unless
// the context ended (leadership lost or stopping: not a failure). A round
// that finds its term superseded (ErrDeposed) ends the fn: the leader
// stands down, and its Elector campaigns again.
func Every(interval time.Duration, round func(context.Context) error, onError func(error)) func(context.Context) {
	return func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if err := round(ctx); err != nil && ctx.Err() == nil {
				onError(err)
				if errors.Is(err, ErrDeposed) {
					return
				}
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
// due items in a total order, after the item it is given (nil: from the
// first), each is handled alone (true: it counted, false: it no longer
// needed handling), and a failure is logged through onError and left for
// the next sweep. Each scan goes on after the last item of the one before,
// failed or not, so items that keep failing never hold up the rest (a
// sweep that went back to the oldest due items would meet the same
// failures first every time, and a batch's worth of them would stall every
// item behind them, other orgs' among them). It stops when a batch comes
// back short or at the first ErrDeposed (returned), and returns how many
// items counted.
func SweepBatches[T any](ctx context.Context, batch int, scan func(ctx context.Context, after *T, batch int) ([]T, error),
	handle func(context.Context, T) (bool, error), onError func(T, error)) (int, error) {
	total := 0
	var after *T
	for {
		sctx, cancel := context.WithTimeout(ctx, StatementTimeout) // (see StatementTimeout)
		due, err := scan(sctx, after, batch)
		cancel()
		if err != nil {
			return total, err
		}
		for _, d := range due {
			counted, err := handle(ctx, d)
			if err != nil {
				if ctx.Err() != nil {
					return total, ctx.Err()
				}
				if errors.Is(err, ErrDeposed) {
					return total, err // every other item would meet it too
				}
				onError(d, err)
				continue
			}
			if counted {
				total++
			}
		}
		if len(due) < batch {
			return total, nil
		}
		after = &due[len(due)-1]
	}
}

package workpool

import "context"

// AfterCommit registers fn to run once the transaction an onComplete hook
// runs in has committed, and reports whether it was registered: only a
// hook's context (the one the pool passes to it) accepts it. If the hook
// fails, or its call is rolled back to retry the calls beside it, what it
// registered is dropped with it; the retried call registers again. fn runs
// on the committing goroutine: it must not block (hand work off instead).
//
// It exists so that what a hook writes for another part of this process
// (an outbox message) can be handed over at once, instead of being found by
// a notification or a poll.
func AfterCommit(ctx context.Context, fn func()) bool {
	a, ok := ctx.Value(commitActionsKey{}).(*commitActions)
	if !ok || a == nil {
		return false
	}
	a.fns = append(a.fns, fn)
	return true
}

type commitActionsKey struct{}

// commitActions are the functions hooks registered in one transaction (or
// one savepoint of it). Hooks of a transaction run one at a time, so it
// needs no lock.
type commitActions struct{ fns []func() }

// withCommitActions returns ctx carrying a fresh collector.
func withCommitActions(ctx context.Context) (context.Context, *commitActions) {
	a := &commitActions{}
	return context.WithValue(ctx, commitActionsKey{}, a), a
}

// keep moves what a savepoint collected into the enclosing collector of ctx,
// if any, once the savepoint is known to stay.
func (a *commitActions) keepIn(ctx context.Context) {
	if parent, ok := ctx.Value(commitActionsKey{}).(*commitActions); ok && parent != nil && parent != a {
		parent.fns = append(parent.fns, a.fns...)
	}
	a.fns = nil
}

// run calls the collected functions (after the commit).
func (a *commitActions) run() {
	fns := a.fns
	a.fns = nil
	for _, fn := range fns {
		fn()
	}
}

// countAfterCommit runs count, a metric's update, once ctx's transaction
// has committed (a transaction rolled back and run again would count
// twice), or at once where ctx carries no commit actions (a caller's own
// transaction, in tests).
func countAfterCommit(ctx context.Context, count func()) {
	if !AfterCommit(ctx, count) {
		count()
	}
}

package db

import "context"

// AfterCommit registers fn to run once the transaction ctx belongs to has
// committed, and reports whether it was registered: only a context from
// WithAfterCommit accepts it (the owner of the transaction made one). A
// transaction rolled back drops what was registered in it. fn runs on the
// committing goroutine: it must not block. What it is for: handing over
// what a transaction wrote (an outbox message) at once, and counting a
// metric once for what committed — a transaction rolled back and run
// again would count twice.
func AfterCommit(ctx context.Context, fn func()) bool {
	a, ok := ctx.Value(afterCommitKey{}).(*Actions)
	if !ok || a == nil {
		return false
	}
	a.fns = append(a.fns, fn)
	return true
}

// CountAfterCommit runs count after ctx's commit (AfterCommit), or at once
// where ctx carries no collector (a caller's own transaction, in tests).
func CountAfterCommit(ctx context.Context, count func()) {
	if !AfterCommit(ctx, count) {
		count()
	}
}

type afterCommitKey struct{}

// Actions are the functions registered in one transaction (or one
// savepoint of it) with AfterCommit. Registrations in a transaction come
// one at a time, so it needs no lock.
type Actions struct{ fns []func() }

// WithAfterCommit returns ctx carrying a fresh collector, which shadows
// any collector ctx carried (a transaction of its own).
func WithAfterCommit(ctx context.Context) (context.Context, *Actions) {
	a := &Actions{}
	return context.WithValue(ctx, afterCommitKey{}, a), a
}

// KeepIn moves what a savepoint collected into the collector ctx carries
// (the enclosing transaction's), if any, once the savepoint is known to
// stay.
func (a *Actions) KeepIn(ctx context.Context) {
	if parent, ok := ctx.Value(afterCommitKey{}).(*Actions); ok && parent != nil && parent != a {
		parent.fns = append(parent.fns, a.fns...)
	}
	a.fns = nil
}

// Run calls the collected functions; call it once the commit succeeded.
func (a *Actions) Run() {
	fns := a.fns
	a.fns = nil
	for _, fn := range fns {
		fn()
	}
}

package mandates

import "context"

// OnCommit registers fn to run once the transaction ctx belongs to has
// committed, and reports whether it was registered: only a context from
// WithOnCommit accepts it — a resolve hook's (the resolving transaction's)
// and the caller's of CancelApprovalTx that made one. A transaction rolled
// back drops what was registered in it. Counting a metric this way counts
// what committed, once.
func OnCommit(ctx context.Context, fn func()) bool {
	c, ok := ctx.Value(onCommitKey{}).(*onCommit)
	if !ok || c == nil {
		return false
	}
	c.fns = append(c.fns, fn)
	return true
}

// WithOnCommit returns ctx carrying a collector for OnCommit, and committed,
// which runs what was registered: call it once the transaction has
// committed (and not at all when it rolled back).
func WithOnCommit(ctx context.Context) (_ context.Context, committed func()) {
	ctx, c := withOnCommit(ctx)
	return ctx, c.run
}

type onCommitKey struct{}

type onCommit struct{ fns []func() }

func withOnCommit(ctx context.Context) (context.Context, *onCommit) {
	c := &onCommit{}
	return context.WithValue(ctx, onCommitKey{}, c), c
}

func (c *onCommit) run() {
	fns := c.fns
	c.fns = nil
	for _, fn := range fns {
		fn()
	}
}

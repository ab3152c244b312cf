package mandates

import "context"

// OnCommit registers fn to run once the resolving transaction a resolve
// hook's ctx belongs to has committed, and reports whether it was
// registered: only a resolve hook's context accepts it. A resolution
// rolled back drops what its hook registered.
func OnCommit(ctx context.Context, fn func()) bool {
	c, ok := ctx.Value(onCommitKey{}).(*onCommit)
	if !ok || c == nil {
		return false
	}
	c.fns = append(c.fns, fn)
	return true
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

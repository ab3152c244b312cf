package workpool

import (
	"context"

	"github.com/reveille/reveille/internal/db"
)

// AfterCommit registers fn to run once the transaction an onComplete hook
// runs in has committed, and reports whether it was registered: only a
// hook's context (the one the pool passes to it) accepts it. If the hook
// fails, or its call is rolled back to retry the calls beside it, what it
// registered is dropped with it; the retried call registers again. fn runs
// on the committing goroutine: it must not block (hand work off instead).
//
// It exists so that what a hook writes for another part of this process
// (an outbox message) can be handed over at once, instead of being found by
// a notification or a poll. (It is db.AfterCommit: a hook may call either.)
func AfterCommit(ctx context.Context, fn func()) bool { return db.AfterCommit(ctx, fn) }

package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// RetryPolicy says how a call is repeated after a 429, a 5xx or a
// connection error. Only calls that may be repeated are: GET, PUT, DELETE,
// POSTs idempotent by nature (cancels), and POSTs sent with an
// Idempotency-Key (every create, spend and append by default). Any call is
// retried when its connection could not even be opened.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included
	// (default 4; 1 disables retries). A request the server never got — a
	// write that failed on a reused connection, an HTTP/2 stream refused
	// or past a graceful GOAWAY — is sent again besides, up to six times a
	// call, as net/http sends such requests again itself.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt (default
	// 100 ms); each further wait doubles, up to MaxBackoff (default 5 s).
	// Each wait is drawn at random from [half of it, all of it), so that
	// clients refused together do not come back together.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxRetryAfter is the longest Retry-After the client waits for within
	// a call (default 30 s); a longer one — or one that would end past the
	// call's context deadline — is not waited for: the answer (a 429's, a
	// 503's *Error, RetryAfter set) is returned at once. A Retry-After
	// waited for is waited with a random part of up to a quarter of it
	// more (at most a second, never past the deadline), so that clients
	// refused together do not come back in the same instant.
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy is the policy of a client made without WithRetry.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, MaxRetryAfter: 30 * time.Second}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts < 1 {
		p.MaxAttempts = DefaultRetryPolicy.MaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = DefaultRetryPolicy.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultRetryPolicy.MaxBackoff
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = DefaultRetryPolicy.MaxRetryAfter
	}
	return p
}

// backoff is the wait after the given failed attempt (1-based): the
// exponential step with jitter in [step/2, step).
func (p RetryPolicy) backoff(attempt int) time.Duration {
	step := p.InitialBackoff
	for i := 1; i < attempt && step < p.MaxBackoff; i++ {
		step *= 2
	}
	step = min(step, p.MaxBackoff)
	half := step / 2
	return half + rand.N(step-half+1)
}

// wait sleeps before the next attempt: the server's Retry-After when it
// gave one (it knows when there is room; see pastRetryAfter), else the
// backoff.
func (p RetryPolicy) wait(ctx context.Context, attempt int, retryAfter time.Duration) error {
	d := p.backoff(attempt)
	if retryAfter > 0 {
		d = pastRetryAfter(ctx, retryAfter, time.Time{})
	}
	return sleep(ctx, d)
}

// maxRetryAfterSpread bounds how far past a Retry-After a wait may end.
const maxRetryAfterSpread = time.Second

// pastRetryAfter is the wait for a Retry-After of d: d and a random part
// of up to a quarter of it (at most maxRetryAfterSpread), so that the
// clients one 429 or 503 refused together — a rate limit's burst, every
// caller during a restart — do not all come back in the same instant, with
// whole seconds (the header's unit) for the server to see them refused
// again together. Never past the context's deadline, nor past until (not
// zero: a live reader's end of MaxOutage), when d itself ends before it.
func pastRetryAfter(ctx context.Context, d time.Duration, until time.Time) time.Duration {
	spread := min(d/4, maxRetryAfterSpread)
	if deadline, ok := ctx.Deadline(); ok && (until.IsZero() || deadline.Before(until)) {
		until = deadline
	}
	if !until.IsZero() {
		// (with room for the time that passes before the wait begins)
		spread = min(spread, time.Until(until)-d-10*time.Millisecond)
	}
	if spread <= 0 {
		return d
	}
	return d + rand.N(spread+1)
}

// neverSent reports whether a transport error happened before the request
// could reach the server (the connection was refused or could not be
// dialled), so that even a call that must not be repeated may be tried
// again.
func neverSent(err error) bool {
	var tokErr *tokenError
	if errors.As(err, &tokErr) {
		return false
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// ReconnectPolicy says how a live reader — Streams.Tail, Approvals.Events —
// connects again after its connection is cut, goes silent or cannot be
// opened. It is not the calls' RetryPolicy (whose MaxAttempts, one
// disabling retries, leaves it be): a live reader rides out an outage — a
// restart, a deploy, a load balancer's 503s — for as long as its context
// lasts, or MaxOutage. An answer retrying cannot change (400, 401, 403,
// 404, 410 …), or an error of the token function, ends it at once.
type ReconnectPolicy struct {
	// InitialBackoff is the wait before the first attempt after a
	// connection ends (default 100 ms); each attempt that fails doubles it,
	// up to MaxBackoff (default 5 s). Each wait is drawn at random from
	// [half of it, all of it], so that readers cut together (by a restart)
	// do not come back together. A 429's or 503's Retry-After is waited
	// instead (and a random part of up to a quarter of it more, at most a
	// second, as RetryPolicy's) — unless it ends past the context's
	// deadline: its *Error then ends the iteration at once.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxOutage bounds how long the reader tries on without a healthy
	// connection (one that brought a byte, or stayed open a second),
	// counted from the end of the last one (or from the start): once the
	// next attempt would come later, the iteration ends with an error
	// naming the last attempt's. 0, the default, sets no bound: the
	// reader tries until its context ends.
	MaxOutage time.Duration
}

// DefaultReconnectPolicy is the policy of a client made without
// WithReconnect.
var DefaultReconnectPolicy = ReconnectPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second}

func (p ReconnectPolicy) withDefaults() ReconnectPolicy {
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = DefaultReconnectPolicy.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultReconnectPolicy.MaxBackoff
	}
	p.MaxOutage = max(p.MaxOutage, 0)
	return p
}

// backoff is the wait after the given failed attempt in a row (1-based).
func (p ReconnectPolicy) backoff(attempt int) time.Duration {
	return RetryPolicy{InitialBackoff: p.InitialBackoff, MaxBackoff: p.MaxBackoff}.backoff(attempt)
}

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
	// (default 4; 1 disables retries).
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
	// 503's *Error, RetryAfter set) is returned at once.
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
// gave one (it knows when there is room), else the backoff.
func (p RetryPolicy) wait(ctx context.Context, attempt int, retryAfter time.Duration) error {
	d := p.backoff(attempt)
	if retryAfter > 0 {
		d = retryAfter
	}
	return sleep(ctx, d)
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

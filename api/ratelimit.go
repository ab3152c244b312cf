package api

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"
)

// orgLimiter is a token bucket per org, so that one org's request volume
// cannot crowd out the others'. It is this replica's: with N replicas
// behind a load balancer an org may make N times the rate in all.
type orgLimiter struct {
	rate  rate.Limit
	burst int
	now   func() time.Time // tests freeze it

	mu        sync.Mutex
	buckets   map[string]*orgBucket
	lastSweep time.Time
}

type orgBucket struct {
	lim      *rate.Limiter
	lastSeen time.Time
}

// limiterSweepEvery is how often idle buckets are dropped.
const limiterSweepEvery = time.Minute

// newOrgLimiter returns nil (no limit) for a rate ≤ 0; burst ≤ 0 is twice
// the rate (at least 1).
func newOrgLimiter(perSecond float64, burst int) *orgLimiter {
	if perSecond <= 0 {
		return nil
	}
	if burst <= 0 {
		burst = int(min(math.Ceil(2*perSecond), math.MaxInt32))
	}
	return &orgLimiter{rate: rate.Limit(perSecond), burst: burst, now: time.Now, buckets: map[string]*orgBucket{}}
}

// take takes one of org's tokens. When there is none it takes nothing and
// returns how long until there is one.
func (l *orgLimiter) take(org string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	// (the clock is read under the lock: read before it, a request that
	// waited for the lock reserved at an instant older than the bucket's
	// last, and x/time/rate credited the time between twice)
	now := l.now()
	l.sweep(now)
	b := l.buckets[org]
	if b == nil {
		b = &orgBucket{lim: rate.NewLimiter(l.rate, l.burst)}
		l.buckets[org] = b
	}
	b.lastSeen = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

// sweep drops the buckets that have been idle long enough to be full
// again: a full bucket is what a new one is, so dropping it changes no
// answer, and the map holds only the orgs seen lately (each needs a valid
// token, but their number is not otherwise bounded).
func (l *orgLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < limiterSweepEvery {
		return
	}
	l.lastSweep = now
	// (past what a Duration holds, the conversion overflowed to a negative
	// refill and every bucket was dropped: a fresh burst each minute)
	refill := time.Duration(math.MaxInt64)
	if secs := float64(l.burst) / float64(l.rate); secs < float64(math.MaxInt64)/float64(time.Second) {
		refill = time.Duration(secs * float64(time.Second))
	}
	for org, b := range l.buckets {
		if now.Sub(b.lastSeen) >= refill {
			delete(l.buckets, org)
		}
	}
}

func (l *orgLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// rateLimit answers 429 with Retry-After (whole seconds, at least 1) when
// the caller's org is out of tokens. It runs after authentication, on /v1
// routes: one token per request, so an SSE connection costs one however
// long it streams.
func (s *Server) rateLimit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		wait := s.limiter.take(PrincipalFrom(c).OrgID)
		if wait <= 0 {
			return next(c)
		}
		secs := max(1, int(math.Ceil(wait.Seconds())))
		s.metrics.rateLimited.WithLabelValues(c.Path()).Inc()
		p := NewProblem(http.StatusTooManyRequests, "rate-limited",
			fmt.Sprintf("the org's request rate limit (%g per second, bursts of %d) is used up; retry in %d s", float64(s.limiter.rate), s.limiter.burst, secs))
		p.retryAfter = secs
		return p
	}
}

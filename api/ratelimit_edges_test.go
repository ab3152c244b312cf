package api

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// take reads the clock before it takes the limiter's lock, so two
// concurrent requests can reach the bucket in the other order than the
// clock they read: a request that read the clock, then waited for the lock
// (held by another org's request, or preempted), reserves at an instant
// older than the bucket's last update. x/time/rate then moves the bucket's
// clock back, and the next request is credited again for the time between
// the two instants: the org gets more than burst + rate × elapsed.
// Here the interleaving is forced: A reads the clock at t0+5 s and is
// delayed until B, at t0+10 s, has taken its token.
func TestTheOrgRateHoldsWhenConcurrentTakesReachTheBucketOutOfClockOrder(t *testing.T) {
	l := newOrgLimiter(1, 20) // 1 per second, bursts of 20
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var (
		mu      sync.Mutex
		clock   = t0
		hold    chan struct{} // the next clock read waits on it, once read
		readAny = make(chan struct{})
	)
	l.now = func() time.Time {
		mu.Lock()
		at, h := clock, hold
		hold = nil
		mu.Unlock()
		if h != nil {
			close(readAny)
			<-h
		}
		return at
	}
	setClock := func(at time.Time) { mu.Lock(); clock = at; mu.Unlock() }

	granted := 0
	for range 20 {
		require.Zero(t, l.take("org-a"))
		granted++
	}
	require.Positive(t, l.take("org-a"), "the burst is spent")

	// A reads the clock at t0+5 s, then is delayed before the lock.
	setClock(t0.Add(5 * time.Second))
	release := make(chan struct{})
	mu.Lock()
	hold = release
	mu.Unlock()
	aDone := make(chan time.Duration, 1)
	go func() { aDone <- l.take("org-a") }()
	<-readAny

	// B, at t0+10 s, reaches the bucket first (or, were the clock read under
	// the lock, waits for A: then A goes first, in clock order).
	setClock(t0.Add(10 * time.Second))
	bDone := make(chan time.Duration, 1)
	go func() { bDone <- l.take("org-a") }()
	select {
	case d := <-bDone:
		bDone <- d
	case <-time.After(time.Second):
	}
	close(release)
	for _, ch := range []chan time.Duration{aDone, bDone} {
		if <-ch == 0 {
			granted++
		}
	}
	// Still at t0+10 s: whatever the bucket has left.
	for l.take("org-a") == 0 {
		granted++
		require.Less(t, granted, 100)
	}
	// In [t0, t0+10 s] at 1 per second with bursts of 20: at most 20 + 10.
	require.LessOrEqual(t, granted, 30, "the org was granted more than burst + rate × elapsed")
}

// A rate whose bucket takes longer than time.Duration can hold to fill
// (burst / rate past ~292 years: REVEILLE_ORG_RATE=1e-11, one request per
// ~3,000 years) makes the sweep's "idle long enough to be full again"
// overflow to a negative duration: every bucket is dropped at each sweep,
// and the org gets a fresh burst every minute.
func TestAnIdleBucketOfAVerySlowRateIsNotDroppedBeforeItIsFull(t *testing.T) {
	l := newOrgLimiter(1e-11, 0) // bursts of 1
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	require.Zero(t, l.take("org-a"))
	require.Positive(t, l.take("org-a"), "the burst is spent")
	now = now.Add(limiterSweepEvery)
	require.Positive(t, l.take("org-a"), "a minute later the org has a token again, for a rate of one per 3,000 years")
}

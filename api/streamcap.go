package api

import (
	"fmt"
	"net/http"
	"sync"
)

// DefaultOrgMaxStreams is how many live streams (Server-Sent Events: run
// stream tails, approvals events) one org may hold open on a replica.
const DefaultOrgMaxStreams = 1000

// orgStreamCap bounds the live streams each org holds open on this
// replica. A stream holds a connection (a file descriptor), a subscription
// and its reads for as long as the client stays, and the rate limit counts
// it once: without a cap, one org's tokens could open connections until
// the process ran out of file descriptors — every org's requests refused,
// and the work the replica runs failing to dial.
//
// The replica's streams together are bounded too, below the server's
// connection bound (replicaStreamShare of REVEILLE_MAX_CONNECTIONS): a
// stream is a connection that never turns idle, so streams of many orgs,
// each under its own cap, could otherwise hold every connection the
// server may open, and every other client — a request, /healthz — would
// wait to be accepted.
type orgStreamCap struct {
	max        int // per org; < 0: none
	replicaMax int // all orgs together, when replicaCap
	replicaCap bool
	mu         sync.Mutex
	open       map[string]int
	total      int
}

// newOrgStreamCap returns the caps: perOrg streams per org (< 0: none),
// and together three quarters of maxConnections (<= 0: none), always
// leaving one connection for requests (a server bounded at one connection
// serves no stream).
func newOrgStreamCap(perOrg, maxConnections int) *orgStreamCap {
	c := &orgStreamCap{max: perOrg, open: map[string]int{}}
	if maxConnections > 0 {
		c.replicaMax, c.replicaCap = maxConnections*3/4, true
	}
	return c
}

// acquire takes one of org's live streams, or refuses with a 429 when it
// holds its cap; release gives it back once the stream ends.
func (c *orgStreamCap) acquire(org string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max >= 0 && c.open[org] >= c.max {
		p := NewProblem(http.StatusTooManyRequests, "too-many-streams", fmt.Sprintf(
			"the org holds %d live streams on this replica, its limit (REVEILLE_ORG_MAX_STREAMS): close one, or retry later", c.max))
		p.retryAfter = streamCapRetryAfterSeconds
		return nil, p
	}
	if c.replicaCap && c.total >= c.replicaMax {
		p := NewProblem(http.StatusServiceUnavailable, "too-many-streams", fmt.Sprintf(
			"this replica holds %d live streams, its limit (three quarters of REVEILLE_MAX_CONNECTIONS, so that requests keep room): retry later, or on another replica", c.replicaMax))
		p.retryAfter = streamCapRetryAfterSeconds
		return nil, p
	}
	c.open[org]++
	c.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.total--
			if c.open[org]--; c.open[org] == 0 {
				delete(c.open, org)
			}
		})
	}, nil
}

// streamCapRetryAfterSeconds is the Retry-After of a stream refused at the
// cap: room comes back only as the org's other streams end.
const streamCapRetryAfterSeconds = 5

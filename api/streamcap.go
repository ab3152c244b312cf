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
type orgStreamCap struct {
	max  int
	mu   sync.Mutex
	open map[string]int
}

// newOrgStreamCap returns nil (no cap) for max < 0.
func newOrgStreamCap(max int) *orgStreamCap {
	if max < 0 {
		return nil
	}
	return &orgStreamCap{max: max, open: map[string]int{}}
}

// acquire takes one of org's live streams, or refuses with a 429 when it
// holds its cap; release gives it back once the stream ends.
func (c *orgStreamCap) acquire(org string) (release func(), err error) {
	if c == nil {
		return func() {}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[org] >= c.max {
		p := NewProblem(http.StatusTooManyRequests, "too-many-streams", fmt.Sprintf(
			"the org holds %d live streams on this replica, its limit (REVEILLE_ORG_MAX_STREAMS): close one, or retry later", c.max))
		p.retryAfter = streamCapRetryAfterSeconds
		return nil, p
	}
	c.open[org]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.open[org]--; c.open[org] == 0 {
				delete(c.open, org)
			}
		})
	}, nil
}

// streamCapRetryAfterSeconds is the Retry-After of a stream refused at the
// cap: room comes back only as the org's other streams end.
const streamCapRetryAfterSeconds = 5

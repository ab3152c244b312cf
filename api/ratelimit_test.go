package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

func withOrgRate(perSecond float64) func(*Config, *Services) {
	return func(c *Config, _ *Services) { c.OrgRate = perSecond }
}

// freezeClock stops the server's rate limiter clock at a fixed instant and
// returns a function that moves it forward.
func freezeClock(s *Server) (advance func(time.Duration)) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s.limiter.now = func() time.Time { return now }
	return func(d time.Duration) { now = now.Add(d) }
}

func TestAnOrgOverItsRateGets429WithRetryAfterWhileAnotherOrgIsServed(t *testing.T) {
	s := newTestServer(t, withOrgRate(1)) // bursts of 2
	advance := freezeClock(s)
	orgA, orgB := token(t, "org-a"), token(t, "org-b")
	whoami := func(tok string) response { return do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil) }

	require.Equal(t, http.StatusOK, whoami(orgA).Status)
	require.Equal(t, http.StatusOK, whoami(orgA).Status)
	r := whoami(orgA)
	p := r.requireProblem(t, http.StatusTooManyRequests)
	require.Equal(t, ProblemTypeBase+"rate-limited", p["type"])
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Equal(t, 1.0, rateLimitedCount(t, s, "/v1/whoami"))

	require.Equal(t, http.StatusOK, whoami(orgB).Status, "another org has its own bucket")
	require.Equal(t, http.StatusOK, whoami(orgB).Status)

	advance(time.Second)
	require.Equal(t, http.StatusOK, whoami(orgA).Status, "a second later the org has a token again")
	require.Equal(t, http.StatusTooManyRequests, whoami(orgA).Status, "and only one")

	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/healthz", "", nil).Status, "routes outside /v1 are not limited")
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", "", nil).requireProblem(t, http.StatusUnauthorized)
}

func TestRetryAfterIsTheWaitForATokenInWholeSecondsAtLeastOne(t *testing.T) {
	cases := []struct {
		rate       float64
		retryAfter string
	}{
		{rate: 1, retryAfter: "1"},
		{rate: 0.4, retryAfter: "3"},  // a token every 2.5 s
		{rate: 1000, retryAfter: "1"}, // a token every ms
		{rate: 1.0 / 3600, retryAfter: "3600"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.rate), func(t *testing.T) {
			s := newTestServer(t, withOrgRate(tc.rate), func(c *Config, _ *Services) { c.OrgBurst = 1 })
			freezeClock(s)
			tok := token(t, "org-a")
			require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).Status)
			r := do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil)
			r.requireProblem(t, http.StatusTooManyRequests)
			require.Equal(t, tc.retryAfter, r.Header.Get("Retry-After"))
		})
	}
}

func TestOrgRateZeroTurnsTheLimitOff(t *testing.T) {
	s := newTestServer(t, withOrgRate(0))
	require.Nil(t, s.limiter)
	tok := token(t, "org-a")
	for range 100 {
		require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).Status)
	}
}

// An SSE connection takes one token when it opens, however many events it
// carries.
func TestAnSSEConnectionCountsOnceAgainstTheRate(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{KeepAlive: 10 * time.Millisecond}), withOrgRate(1)) // bursts of 2
	freezeClock(s)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	tok := agentToken(t, "org-a")

	sse := openSSEURL(t, srv.URL+streamBase+"out/sse", tok)
	for i := range 5 {
		// Written past the HTTP layer, so that only the SSE connection
		// spends the org's tokens.
		_, err := s.svc.Streams.Append(context.Background(), "org-a", "run-1", "out", [][]byte{fmt.Appendf(nil, "c%d", i)})
		require.NoError(t, err)
		require.Equal(t, sseEvent{ID: fmt.Sprint(i), Data: b64(fmt.Sprintf("c%d", i))}, sse.next(t))
	}
	require.Equal(t, http.StatusOK, do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).Status, "the second token is left")
	do(t, s.Handler(), http.MethodGet, "/v1/whoami", tok, nil).requireProblem(t, http.StatusTooManyRequests)
}

func TestIdleOrgBucketsAreDroppedOnceFullAgain(t *testing.T) {
	l := newOrgLimiter(1, 2) // full again 2 s after its last use
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	for i := range 1000 {
		require.Zero(t, l.take(fmt.Sprint("org-", i)))
	}
	require.Equal(t, 1000, l.size())

	now = now.Add(limiterSweepEvery)
	require.Zero(t, l.take("org-0"))
	require.Zero(t, l.take("org-0"))
	require.Equal(t, 1, l.size(), "only the org just seen is kept")
	require.Positive(t, l.take("org-0"), "and its bucket is not reset by the sweep")

	now = now.Add(limiterSweepEvery)
	require.Zero(t, l.take("org-1"))
	require.Equal(t, 1, l.size())
}

func rateLimitedCount(t *testing.T, s *Server, route string) float64 {
	t.Helper()
	families, err := s.cfg.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "reveille_http_rate_limited_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == route {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// An org holds at most OrgMaxStreams live streams on a replica: each holds
// a connection for as long as its client stays, and one org's could
// otherwise take every file descriptor the process has. Another org's
// streams are its own, and a stream that ends gives its place back.
func TestAnOrgAtItsCapOfLiveStreamsIsRefused429AndOthersAreNot(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{KeepAlive: 10 * time.Millisecond}),
		func(c *Config, _ *Services) { c.OrgMaxStreams = 2 })
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	orgA, orgB := agentToken(t, "org-a"), agentToken(t, "org-b")

	first := openSSEURL(t, srv.URL+streamBase+"out/sse", orgA)
	openSSEURL(t, srv.URL+streamBase+"other/sse", orgA)
	r := do(t, s.Handler(), http.MethodGet, streamBase+"out/sse", orgA, nil)
	p := r.requireProblem(t, http.StatusTooManyRequests)
	require.Equal(t, ProblemTypeBase+"too-many-streams", p["type"])
	require.Equal(t, "the org holds 2 live streams on this replica, its limit (REVEILLE_ORG_MAX_STREAMS): close one, or retry later", p["detail"])
	require.Equal(t, "5", r.Header.Get("Retry-After"))

	openSSEURL(t, srv.URL+streamBase+"out/sse", orgB)

	require.NoError(t, first.resp.Body.Close())
	require.Eventually(t, func() bool {
		return s.streamCap.held("org-a") == 1
	}, 10*time.Second, 10*time.Millisecond, "the ended stream's place is given back")
	openSSEURL(t, srv.URL+streamBase+"out/sse", orgA)
}

// held is how many live streams org holds.
func (c *orgStreamCap) held(org string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open[org]
}

// Live streams never turn idle: at MaxConnections the server waits for one
// to close before it accepts anyone else. The replica's streams together
// (every org's, each under its own cap) hold at most three quarters of the
// bound, so that a request — /healthz, another org's call — is accepted.
func TestLiveStreamsOfEveryOrgLeaveRoomForRequestsAtMaxConnections(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{KeepAlive: time.Hour}), func(c *Config, _ *Services) { c.MaxConnections = 4 })
	addr := serveOn(t, s)
	url := "http://" + addr
	orgA, orgB := agentToken(t, "org-a"), agentToken(t, "org-b")
	openSSEURL(t, url+streamBase+"a/sse", orgA)
	openSSEURL(t, url+streamBase+"a/sse", orgA)
	openSSEURL(t, url+streamBase+"b/sse", orgB)

	req, err := http.NewRequest(http.MethodGet, url+streamBase+"b/sse", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+orgB)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	var p map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
	require.Equal(t, ProblemTypeBase+"too-many-streams", p["type"])
	require.Equal(t, "this replica holds 3 live streams, its limit (three quarters of REVEILLE_MAX_CONNECTIONS, so that requests keep room): retry later, or on another replica", p["detail"])
	require.Equal(t, "5", res.Header.Get("Retry-After"))

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ask(t, conn)
	require.True(t, answered(t, conn, testWait), "/healthz is answered beside the streams")
}

// Whatever the bound, the streams together leave a connection for
// requests: at MaxConnections 1, no stream.
func TestTheReplicasStreamsLeaveAConnectionForRequestsAtAnyBound(t *testing.T) {
	for _, tc := range []struct{ maxConns, streams int }{{1, 0}, {2, 1}, {3, 2}, {4, 3}, {100, 75}} {
		c := newOrgStreamCap(-1, tc.maxConns)
		for i := range tc.streams {
			_, err := c.acquire(fmt.Sprint("org-", i))
			require.NoError(t, err, "MaxConnections %d: stream %d", tc.maxConns, i)
		}
		_, err := c.acquire("org-x")
		var p *Problem
		require.ErrorAs(t, err, &p, "MaxConnections %d: one stream past %d", tc.maxConns, tc.streams)
		require.Equal(t, http.StatusServiceUnavailable, p.Status)
	}
}

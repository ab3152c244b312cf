package api

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// Short server timeouts, so that the tests see them expire.
const (
	shortHeaderTimeout = 100 * time.Millisecond
	shortReadTimeout   = 300 * time.Millisecond
	shortIdleTimeout   = 300 * time.Millisecond
	shortWriteTimeout  = 300 * time.Millisecond
)

func withShortTimeouts(c *Config, _ *Services) {
	c.ReadHeaderTimeout, c.ReadTimeout, c.IdleTimeout = shortHeaderTimeout, shortReadTimeout, shortIdleTimeout
	c.WriteTimeout = shortWriteTimeout
}

// serveOn runs s on a real listener (the timeouts live in http.Server) and
// returns its address.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// dribble writes first, then rest one byte at a time, pausing between
// bytes, until it is done, a write fails or stop is closed: a slowloris.
func dribble(conn net.Conn, first, rest string, stop <-chan struct{}) {
	if _, err := io.WriteString(conn, first); err != nil {
		return
	}
	for i := range len(rest) {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if _, err := io.WriteString(conn, rest[i:i+1]); err != nil {
			return
		}
	}
}

// requireDisconnected reads conn until the server closes it (EOF or a
// reset), failing if it is still open after testWait; it returns what was
// read.
func requireDisconnected(t *testing.T, conn net.Conn) string {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(testWait)))
	var got strings.Builder
	_, err := io.Copy(&got, conn)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the server kept the connection open; read so far: %q", got.String())
	return got.String()
}

func TestSlowClientsAreDisconnected(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{}), withShortTimeouts)
	addr := serveOn(t, s)
	tok := agentToken(t, "org-a")
	// Each slow part takes 100 × 10 ms, far over its timeout.
	slow := strings.Repeat("x", 100)
	cases := []struct {
		name        string
		first, rest string
		response    string // the status line the server answers with, if any
	}{
		{
			name:  "headers sent slowly",
			first: "GET /healthz HTTP/1.1\r\nHost: test\r\n", rest: "X-Slow: " + slow + "\r\n\r\n",
		},
		{
			name: "body sent slowly",
			first: "POST " + streamBase + "slow/chunks HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + tok +
				"\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n",
			rest:     slow,
			response: "HTTP/1.1 408 Request Timeout",
		},
		{
			name:     "idle after a request",
			first:    "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n",
			response: "HTTP/1.1 200 OK",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			stop := make(chan struct{})
			defer close(stop)
			go dribble(conn, tc.first, tc.rest, stop)
			got := requireDisconnected(t, conn)
			if tc.response == "" {
				// Never served. net/http closes without a word when the
				// header timeout surfaces as a timeout; under load it can
				// surface mid-line as a malformed header instead, which
				// net/http answers with a bare 400 before closing (seen once
				// in CI). Either way the slow client is cut off unserved.
				if got != "" {
					status, _, _ := strings.Cut(got, "\r\n")
					require.Equal(t, "HTTP/1.1 400 Bad Request", status, "no response to a request never fully sent, or net/http's bare 400")
				}
			} else if got != "" { // a reset may beat the response to the client
				status, _, _ := strings.Cut(got, "\r\n")
				require.Equal(t, tc.response, status)
			}
		})
	}
	require.Equal(t, map[string]any{"tail_index": -1.0, "done": false},
		do(t, s.Handler(), http.MethodGet, streamBase+"slow", tok, nil).JSON(t), "the slow append stored nothing")
}

// A client that stops reading is cut off after the write timeout — a page
// of megabytes, or a live tail, no longer holds the handler, its encoded
// answer, the org's stream slot and the connection until the client goes.
func TestClientsThatStopReadingAreDisconnected(t *testing.T) {
	s := newTestServer(t, withStreams(t, streams.Config{KeepAlive: 20 * time.Millisecond}), withShortTimeouts,
		func(c *Config, _ *Services) { c.OrgMaxStreams = 1 })
	addr := serveOn(t, s)
	tok := agentToken(t, "org-a")
	// 12 MiB of chunks: a page or a tail batch holds up to 8 MiB of them
	// (MaxRequest), ~11 MB as base64, more than a socket's buffers take.
	chunk := make([]byte, 1<<20-1)
	for range 12 {
		r := do(t, s.Handler(), http.MethodPost, streamBase+"big/chunks", tok, chunk, "Content-Type", "application/octet-stream")
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	}
	for _, tc := range []struct{ name, path string }{
		{"a page", streamBase + "big/chunks"},
		{"a live tail", streamBase + "big/sse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
			_, err = io.WriteString(conn, "GET "+tc.path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tok+"\r\n\r\n")
			require.NoError(t, err)
			require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 1 }, testWait, 5*time.Millisecond)
			// Nothing is read until the server gave up.
			require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 0 }, testWait, 10*time.Millisecond,
				"the server still holds the connection of a client that stopped reading")
			require.Zero(t, s.streamCap.held("org-a"), "the tail's stream slot is given back")
			// What was sent before is still there to read (all of it would
			// take long through a 4 kB window) — if anything was: on a slow
			// machine the timeout can pass before the first write.
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(testWait)))
			status, err := bufio.NewReader(conn).ReadString('\n')
			if err == nil {
				require.Equal(t, "HTTP/1.1 200 OK\r\n", status)
			} else {
				require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the connection is still open")
			}
		})
	}
}

// An SSE response outlives the read, write and idle timeouts while
// keep-alives flow, and still delivers chunks afterwards: each write has a
// write timeout of its own.
func TestAnSSEStreamOutlivesTheServerTimeouts(t *testing.T) {
	const keepAlive = 20 * time.Millisecond
	s := newTestServer(t, withStreams(t, streams.Config{KeepAlive: keepAlive}), withShortTimeouts)
	url := "http://" + serveOn(t, s)
	tok := agentToken(t, "org-a")
	sse := openSSEURL(t, url+streamBase+"out/sse", tok)

	// A ticker never delivers its nth tick before n periods have passed, so
	// these keep-alives span more than twice the read and idle timeouts.
	keepAlives := 2*int(max(shortReadTimeout, shortIdleTimeout, shortWriteTimeout)/keepAlive) + 1
	deadline := time.After(testWait)
	for range keepAlives {
		select {
		case ev, ok := <-sse.events:
			require.True(t, ok, "the event stream ended")
			require.Equal(t, sseEvent{Comment: "keep-alive"}, ev)
		case <-deadline:
			t.Fatal("keep-alives stopped")
		}
	}
	r := do(t, s.Handler(), http.MethodPost, streamBase+"out/chunks", tok, []byte("late"), "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	require.Equal(t, sseEvent{ID: "0", Data: b64("late")}, sse.next(t))
}

// ask sends a GET /healthz on conn.
func ask(t *testing.T, conn net.Conn) {
	t.Helper()
	_, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
}

// answered reports whether conn got a 200 within the time given.
func answered(t *testing.T, conn net.Conn, within time.Duration) bool {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(within)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// The server holds at most MaxConnections open, so that clients cannot take
// the file descriptors the replica's database, Temporal and outbound
// connections need (reveille_http_open_connections counts them). At the
// bound a new connection takes the place of the one idle the longest
// between requests — kept-alive connections, cheap to keep, would
// otherwise fill it and leave every other client waiting, /healthz
// included — and waits only while every connection is busy.
func TestAtMaxConnectionsANewConnectionTakesAnIdleOnesPlaceOrWaits(t *testing.T) {
	dial := func(t *testing.T, addr string) net.Conn {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	atLimit := func(s *Server, action string) float64 {
		return testutil.ToFloat64(s.metrics.atLimit.WithLabelValues(action))
	}

	t.Run("the one idle the longest is closed for it", func(t *testing.T) {
		s := newTestServer(t, func(c *Config, _ *Services) { c.MaxConnections = 2 })
		addr := serveOn(t, s)
		idle := func() int {
			l := s.connLimit.Load()
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.idle.Len()
		}
		var kept []net.Conn
		for i := range 2 {
			conn := dial(t, addr)
			ask(t, conn)
			require.True(t, answered(t, conn, testWait))
			// (net/http marks a connection idle after its answer is sent)
			require.Eventually(t, func() bool { return idle() == i+1 }, testWait, time.Millisecond)
			kept = append(kept, conn) // idle, kept alive
		}
		require.Equal(t, 2.0, testutil.ToFloat64(s.metrics.connections))

		third := dial(t, addr)
		ask(t, third)
		require.True(t, answered(t, third, testWait), "a new connection waited behind idle ones")
		require.Equal(t, 1.0, atLimit(s, "closed_idle"))
		require.NoError(t, kept[0].SetReadDeadline(time.Now().Add(testWait)))
		_, err := kept[0].Read(make([]byte, 1))
		require.Error(t, err, "the connection idle the longest is closed")
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the connection idle the longest is still open")
		ask(t, kept[1])
		require.True(t, answered(t, kept[1], testWait), "the other idle connection was closed too")
		// (the gauge drops when the closed connection's serving goroutine
		// sees the close and reports it — after the client may see it)
		require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 2 }, testWait, time.Millisecond,
			"open connections: %v", testutil.ToFloat64(s.metrics.connections))
	})

	t.Run("while all are busy it waits for one to close", func(t *testing.T) {
		s := newTestServer(t, func(c *Config, _ *Services) { c.MaxConnections = 2; c.ReadHeaderTimeout = time.Minute })
		addr := serveOn(t, s)
		var busy []net.Conn
		for range 2 {
			conn := dial(t, addr)
			_, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\n") // a request half sent
			require.NoError(t, err)
			busy = append(busy, conn)
		}
		require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 2 }, testWait, 5*time.Millisecond)

		third := dial(t, addr)
		ask(t, third)
		require.False(t, answered(t, third, 200*time.Millisecond), "answered past the limit")
		require.Equal(t, 1.0, atLimit(s, "waited"))
		require.Zero(t, atLimit(s, "closed_idle"), "a busy connection was closed")

		require.NoError(t, busy[0].Close())
		require.True(t, answered(t, third, testWait), "not answered once a connection closed")
	})
}

// With an ops address, /metrics (totals across orgs) is served on the ops
// listener alone, beside the probes, which stay on the API's listener too —
// and there they are answered while every API connection is busy.
func TestTheOpsListenerServesTheProbesAndMetricsAlone(t *testing.T) {
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.OpsAddr = "127.0.0.1:0" // Serve and ServeOps take listeners of their own
		c.MaxConnections, c.ReadHeaderTimeout = 1, time.Minute
	})
	api := serveOn(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeOps(ctx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	ops := "http://" + ln.Addr().String()

	get := func(url string) (int, string) {
		t.Helper()
		res, err := (&http.Client{Timeout: testWait}).Get(url)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		status, _ := get(ops + path)
		require.Equal(t, http.StatusOK, status, path)
	}
	_, metrics := get(ops + "/metrics")
	require.Contains(t, metrics, "reveille_http_open_connections")
	status, _ := get(ops + "/v1/whoami")
	require.Equal(t, http.StatusNotFound, status, "the API's routes are not on the ops listener")
	status, _ = get("http://" + api + "/metrics")
	require.Equal(t, http.StatusNotFound, status, "/metrics is still on the API's listener")
	status, _ = get("http://" + api + "/healthz")
	require.Equal(t, http.StatusOK, status, "the probes left the API's listener")

	// Every API connection busy: a request half sent holds the only one.
	busy, err := net.Dial("tcp", api)
	require.NoError(t, err)
	t.Cleanup(func() { busy.Close() })
	_, err = io.WriteString(busy, "GET /healthz HTTP/1.1\r\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 1 }, testWait, 5*time.Millisecond)
	status, _ = get(ops + "/healthz")
	require.Equal(t, http.StatusOK, status)
}

// ServeOps without an ops address is a wiring mistake, said as such.
func TestServeOpsWithoutAnOpsAddressFails(t *testing.T) {
	s := newTestServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.ErrorContains(t, s.ServeOps(context.Background(), ln), "ServeOps without Config.OpsAddr")
}

// At MaxConnections a new connection waits "only while all are busy": once
// one of the busy connections turns idle (its answer sent, kept alive), the
// waiting one takes its place, as a new one arriving then would. It kept
// waiting, until the idle connection closed on its own (IdleTimeout, 120 s
// by default), and Accept with it.
func TestMaxConnections_AWaitingConnectionTakesThePlaceOfOneThatTurnsIdle(t *testing.T) {
	s := newTestServer(t, func(c *Config, _ *Services) {
		c.MaxConnections = 2
		c.ReadHeaderTimeout, c.IdleTimeout = time.Minute, time.Minute
	})
	addr := serveOn(t, s)
	var busy []net.Conn
	for range 2 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\n") // a request half sent
		require.NoError(t, err)
		busy = append(busy, conn)
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.connections) == 2 }, testWait, 5*time.Millisecond)

	third, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { third.Close() })
	ask(t, third)
	require.False(t, answered(t, third, 200*time.Millisecond), "answered past the limit")

	// busy[0] finishes its request: answered, it is idle, kept alive.
	_, err = io.WriteString(busy[0], "Host: x\r\n\r\n")
	require.NoError(t, err)
	require.True(t, answered(t, busy[0], testWait))

	require.True(t, answered(t, third, 5*time.Second),
		"the waiting connection is still waiting although a connection is idle (closed_idle=%v)",
		testutil.ToFloat64(s.metrics.atLimit.WithLabelValues("closed_idle")))
}

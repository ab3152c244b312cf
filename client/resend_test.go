package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// headersThenResetConn fails, once armed, every write after the first
// write that starts with an HTTP/2 HEADERS frame: the request's HEADERS
// reached the server, then the connection was reset before the next write.
type headersThenResetConn struct {
	net.Conn
	armed, sawHeaders atomic.Bool
}

func (c *headersThenResetConn) Write(p []byte) (int, error) {
	if c.armed.Load() && c.sawHeaders.Load() {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: syscall.ECONNRESET}
	}
	n, err := c.Conn.Write(p)
	if c.armed.Load() && len(p) >= 9 && p[3] == 0x1 /* HEADERS */ {
		c.sawHeaders.Store(true)
	}
	return n, err
}

// Over HTTP/2 a call without a body that must not act twice goes out as
// HEADERS (flushed alone: the Go server runs the handler on them) and then
// an empty DATA frame with END_STREAM. When the connection breaks between
// the two writes, the error is a bare write error on a reused connection,
// as when nothing was written over HTTP/1.1 — but the redelivery acted: it
// is not sent again as a request that never reached the server, and the
// call may have been applied. (A review proved it acted twice, the call
// reporting one success.)
func TestABodylessRedeliveryWhoseHTTP2HeadersWentOutIsNotSentAgainUnseen(t *testing.T) {
	var redeliveries atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			redeliveries.Add(1)                // (the redelivery is done: it reads no body)
			time.Sleep(100 * time.Millisecond) // (its answer comes after the connection broke)
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	startH2C(srv)
	t.Cleanup(srv.Close)

	dial, conns := trackedDial(func(conn net.Conn) *headersThenResetConn { return &headersThenResetConn{Conn: conn} })
	tr := h2cTransport(t, dial)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background()) // (the connection is reused next)
	require.NoError(t, err)
	// (only the connection dialled so far breaks: a new one is healthy)
	for _, conn := range conns() {
		conn.armed.Store(true)
	}

	_, err = c.Wakeups.Redeliver(context.Background(), "0190f0f0-0000-7000-8000-000000000000")
	t.Logf("err: %v; redeliveries the server did: %d", err, redeliveries.Load())
	if err == nil {
		require.EqualValues(t, 1, redeliveries.Load(), "the call reported one success: the server redelivered %d times", redeliveries.Load())
	} else {
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe, "the server redelivered: %v", err)
	}
}

// A live reader answered a 503 with a Retry-After that fits in its
// MaxOutage waits it out and reconnects: the Retry-After's random spread
// never pushes the wait past MaxOutage. (A review proved it did, most
// times, when the spread was bounded by the context's deadline alone.)
func TestARetryAfterSpreadDoesNotEndALiveReaderWithinMaxOutage(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"restarting","status":503}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "id: 0\ndata: AA==\n\nevent: end\ndata: {\"tail_index\": 1}\n\n")
	}))
	t.Cleanup(srv.Close)
	fails := 0
	const runs = 3
	for i := 0; i < runs; i++ {
		n.Store(0)
		c, err := client.New(srv.URL, client.WithToken("t"),
			client.WithReconnect(client.ReconnectPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxOutage: 1100 * time.Millisecond}))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var got error
		for _, err := range c.Streams.Tail(ctx, "run", "out", client.TailParams{}) {
			got = err
			break
		}
		cancel()
		if got != nil {
			fails++
			t.Logf("run %d: %v", i, got)
		}
	}
	require.Zero(t, fails, "of %d runs, the reader gave up within MaxOutage", runs)
}

// A token function's error ends the call at once ("trying again is the
// token source's business, not the retry loop's"), whatever it says: one
// that reads like a refused HTTP/2 stream is not sent again as a request
// the server never got. (A review proved it was asked seven times.)
func TestATokenErrorThatReadsLikeARefusedStreamIsNotSentAgain(t *testing.T) {
	var asked atomic.Int32
	c, err := client.New("http://127.0.0.1:1", client.WithTokenFunc(func(context.Context) (string, error) {
		asked.Add(1)
		return "", errors.New(`Post "https://idp.example/token": stream error: stream ID 3; REFUSED_STREAM; received from peer`)
	}), client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Mandates.Spend(context.Background(), client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
	require.ErrorContains(t, err, "getting the bearer token")
	require.EqualValues(t, 1, asked.Load(), "the token function asked once")
}

// Readyz, a GET (not retried), follows a 307 where the caller's
// CheckRedirect follows redirects, as Whoami does: it is not a call that
// must not act twice.
func TestReadyzFollowsARedirectAsTheCallersPolicySays(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/readyz" {
			_, _ = io.WriteString(w, `{"status":"ok"}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	t.Cleanup(target.Close)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(front.Close)
	follow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	c, err := client.New(front.URL, client.WithToken("t"), client.WithHTTPClient(follow))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background())
	require.NoError(t, err, "a GET follows the caller's policy")
	_, err = c.Readyz(context.Background())
	require.NoError(t, err, "Readyz is a GET too")
}

// The commonest keep-alive race over HTTP/1.1: the server (its IdleTimeout,
// a load balancer's) closes an idle connection just as the client takes it
// from the pool. net/http reports "http: server closed idle connection":
// the server never saw the request. A redelivery (no body, unkeyed, not
// idempotent) so failed is sent again at once and succeeds — not reported
// "may have been applied", as a review proved it was.
func TestARedeliveryOnAConnectionTheServerClosedWhileIdleIsSentAgain(t *testing.T) {
	var redeliveries atomic.Int32
	var mu sync.Mutex
	var serverConns []net.Conn
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			serverConns = append(serverConns, c)
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background()) // a keep-alive connection, idle in the pool
	require.NoError(t, err)

	// The server closes the idle connection the moment the client takes it
	// (its idle timeout firing then).
	var once sync.Once
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			return
		}
		once.Do(func() {
			mu.Lock()
			for _, sc := range serverConns {
				sc.Close()
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond) // (the transport's read loop sees the close)
		})
	}})
	_, err = c.Wakeups.Redeliver(ctx, "0190f0f0-0000-7000-8000-000000000000")
	t.Logf("err: %v; redeliveries the server did: %d", err, redeliveries.Load())
	require.NoError(t, err, "the server never saw the first request")
	require.EqualValues(t, 1, redeliveries.Load())
}

// Over HTTP/1.1 a write that failed with nothing written on a reused
// connection (net/http hands back the bare write error) never reached the
// server: a redelivery so failed is sent again at once and succeeds. (The
// headers-alone concern is HTTP/2's: TestABodylessRedeliveryWhoseHTTP2HeadersWentOutIsNotSentAgainUnseen.)
type failNextWriteConn struct {
	net.Conn
	armed atomic.Bool
}

func (c *failNextWriteConn) Write(p []byte) (int, error) {
	if c.armed.CompareAndSwap(true, false) {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errors.New("connection reset by peer")}
	}
	return c.Conn.Write(p)
}

func TestARedeliveryWhoseHTTP1WriteFailedWithNothingWrittenIsSentAgain(t *testing.T) {
	var redeliveries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	t.Cleanup(srv.Close)
	dial, conns := trackedDial(func(conn net.Conn) *failNextWriteConn { return &failNextWriteConn{Conn: conn} })
	tr := &http.Transport{DialContext: dial}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background())
	require.NoError(t, err)
	for _, fc := range conns() {
		fc.armed.Store(true)
	}
	_, err = c.Wakeups.Redeliver(context.Background(), "0190f0f0-0000-7000-8000-000000000000")
	t.Logf("err: %v; redeliveries the server did: %d", err, redeliveries.Load())
	requireSentAgainOrSaidMaybe(t, err, redeliveries.Load())
}

// A delete over HTTP/2 goes out as HEADERS then an empty END_STREAM DATA
// frame (its body is the unrewindable empty one), and the Go server runs
// the handler on the HEADERS: the webhook is deleted. When the DATA frame's
// write fails, the first answer was lost (not a request the server never
// got), so the retry's 404 is the delete's own effect, and the call
// succeeds. (A review proved it reported not found.)
func TestADeleteWhoseHTTP2HeadersWentOutSucceeds(t *testing.T) {
	var deletes atomic.Int32
	var firstConn atomic.Value // the remote address of the connection Whoami made
	firstDone := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			if r.RemoteAddr == firstConn.Load() { // the first attempt, on the reused connection
				close(firstDone)                   // the webhook is deleted
				time.Sleep(200 * time.Millisecond) // (its answer comes after the connection broke)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			select { // (the resend's handler runs after the first's, which it may race)
			case <-firstDone:
			case <-time.After(time.Second):
				w.WriteHeader(http.StatusNoContent) // nothing deleted it: this one does
				return
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		firstConn.CompareAndSwap(nil, r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	startH2C(srv)
	t.Cleanup(srv.Close)

	dial, conns := trackedDial(func(conn net.Conn) *headersThenResetConn { return &headersThenResetConn{Conn: conn} })
	tr := h2cTransport(t, dial)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background())
	require.NoError(t, err)
	for _, hc := range conns() {
		hc.armed.Store(true)
	}

	err = c.ApprovalWebhooks.Delete(context.Background(), "hook")
	time.Sleep(50 * time.Millisecond)
	t.Logf("err: %v; deletes the server handled: %d", err, deletes.Load())
	require.NotZero(t, deletes.Load(), "the server ran the first delete on its HEADERS")
	require.NoError(t, err, "the first request deleted the webhook; the resend's 404 was returned")
}

package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// bigToken is a bearer token larger than net/http's 4 KiB HTTP/1.1 write
// buffer (e.g. a JWT carrying many claims): the request's headers no longer
// fit in one buffered write, so the first write syscall happens inside
// Request.write, and its failure is reported to WroteRequest — with nothing
// on the wire.
var bigToken = strings.Repeat("x", 6000)

// countingFailNextWriteConn fails its next write, once armed, with nothing
// written, and counts the bytes it let through.
type countingFailNextWriteConn struct {
	net.Conn
	armed   atomic.Bool
	written atomic.Int64
}

func (c *countingFailNextWriteConn) Write(p []byte) (int, error) {
	if c.armed.CompareAndSwap(true, false) {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errors.New("connection reset by peer")}
	}
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func resetOnceClient(t *testing.T, h http.HandlerFunc, token string) (*client.Client, func()) {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	dial, conns := trackedDial(func(conn net.Conn) *countingFailNextWriteConn { return &countingFailNextWriteConn{Conn: conn} })
	tr := &http.Transport{DialContext: dial}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(srv.URL, client.WithToken(token), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background()) // a connection to reuse
	require.NoError(t, err)
	arm := func() {
		for _, fc := range conns() {
			fc.armed.Store(true)
		}
	}
	return c, arm
}

func whoami(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
}

// The same case as
// TestARedeliveryWhoseHTTP1WriteFailedWithNothingWrittenIsSentAgain with a
// bearer token over 4 KiB: nothing reached the server, and the redelivery
// is sent again at once. (A review proved it reported "may have been
// applied": the write failing among the headers was read as one after
// them.)
func TestARedeliveryWithABigTokenWhoseHTTP1WriteFailedWithNothingWrittenIsSentAgain(t *testing.T) {
	var redeliveries atomic.Int32
	c, arm := resetOnceClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		whoami(w)
	}, bigToken)
	arm()
	_, err := c.Wakeups.Redeliver(context.Background(), "0190f0f0-0000-7000-8000-000000000000")
	t.Logf("err: %v; redeliveries the server did: %d", err, redeliveries.Load())
	requireSentAgainOrSaidMaybe(t, err, redeliveries.Load())
}

// A delete of a webhook that does not exist, with a bearer token over
// 4 KiB, whose first write on a reused HTTP/1.1 connection failed with
// nothing written: the server never saw it, and the retry's 404 is the
// truth — there was nothing to delete. (A review proved the client
// reported success.)
func TestADeleteWithABigTokenWhoseHTTP1WriteFailedWithNothingWrittenIsNotFound(t *testing.T) {
	var deletes atomic.Int32
	c, arm := resetOnceClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		whoami(w)
	}, bigToken)
	arm()
	err := c.ApprovalWebhooks.Delete(context.Background(), "no-such-hook")
	t.Logf("err: %v; deletes the server handled: %d", err, deletes.Load())
	require.Error(t, err, "the webhook never existed and the server saw one delete, answered 404: a false success")
}

// Control: the same delete with a small token reports the 404.
func TestADeleteWhoseHTTP1WriteFailedWithNothingWrittenIsNotFound(t *testing.T) {
	c, arm := resetOnceClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		whoami(w)
	}, "t")
	arm()
	err := c.ApprovalWebhooks.Delete(context.Background(), "no-such-hook")
	t.Logf("err: %v", err)
	require.Error(t, err)
}

// headersThenStallConn, once armed, writes a write that starts with an
// HTTP/2 HEADERS frame through and then stalls (a full TCP send window)
// until released.
type headersThenStallConn struct {
	net.Conn
	armed   atomic.Bool
	release chan struct{}
}

func (c *headersThenStallConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.armed.Load() && len(p) >= 9 && p[3] == 0x1 /* HEADERS */ {
		c.armed.Store(false)
		<-c.release
	}
	return n, err
}

// Over HTTP/2 a redelivery's HEADERS reach the server (which acts on them),
// and the context ends while the transport is still in that write: the
// transport reports the write only after the call returned, so a call
// whose context ended on a connection may have been applied, and says so.
// (A review proved it was a bare context error.)
func TestAnHTTP2RedeliveryCanceledWhileItsHeadersAreWrittenMayHaveBeenApplied(t *testing.T) {
	var redeliveries atomic.Int32
	started := make(chan struct{})
	handlerRelease := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
			close(started)
			<-handlerRelease
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		whoami(w)
	}))
	startH2C(srv)
	t.Cleanup(srv.Close)
	release := make(chan struct{})
	dial, conns := trackedDial(func(conn net.Conn) *headersThenStallConn { return &headersThenStallConn{Conn: conn, release: release} })
	tr := h2cTransport(t, dial)
	t.Cleanup(func() { close(handlerRelease); close(release) })
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background())
	require.NoError(t, err)
	for _, hc := range conns() {
		hc.armed.Store(true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	_, err = c.Wakeups.Redeliver(ctx, "0190f0f0-0000-7000-8000-000000000000")
	t.Logf("err: %v; redeliveries the server did: %d", err, redeliveries.Load())
	require.EqualValues(t, 1, redeliveries.Load())
	var maybe *client.MaybeAppliedError
	require.True(t, errors.As(err, &maybe), "the server acted on the HEADERS, yet: %v", err)
}

// requireSentAgainOrSaidMaybe is what a request whose write failed with
// nothing written on a reused HTTP/1.1 connection comes to: sent again at
// once, acting once (acted 1, no error) — or, when net/http reports the
// failure as its read of the connection it closed itself (a race inside
// the transport: "use of closed network connection", which it also reports
// after a request went out whole), an error — "may have been applied" when
// the transport had reported the request written — with nothing acted on:
// never a success that hides a second action.
func requireSentAgainOrSaidMaybe(t *testing.T, err error, acted int32) {
	t.Helper()
	if err == nil {
		require.EqualValues(t, 1, acted)
		return
	}
	require.ErrorIs(t, err, net.ErrClosed, "only the transport's read race: %v", err)
	require.Zero(t, acted)
}

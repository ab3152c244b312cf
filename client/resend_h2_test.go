package client_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A Client made over a caller's own HTTP/2 transport whose connection is
// already warm (another Client sharing it: one per tenant) does not send a
// redelivery again unseen when its HEADERS went out (and acted) before the
// connection broke: the transport reports that the request's write failed
// after them, whatever the Client saw before. (A review proved that a flag
// learned from the Client's own answers let it act twice.)
func TestAFreshClientOnAWarmHTTP2TransportDoesNotRedeliverTwiceUnseen(t *testing.T) {
	var redeliveries atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
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
	hc := &http.Client{Transport: tr}

	// The caller's transport is warm: another Client sharing it made a call.
	other, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(hc))
	require.NoError(t, err)
	_, err = other.Whoami(context.Background())
	require.NoError(t, err)

	// A new Client on the same transport; its first call is a redelivery.
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(hc),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
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

// One http.Transport speaks both protocols when the servers behind the
// API's name differ in ALPN (a fleet mid-rollout): here the TLS server
// offers h2 on every other handshake. A delete of a webhook that does not
// exist, whose HTTP/1.1 write failed with nothing written after an HTTP/2
// answer, never reached the server: its 404 is not found, not a success.
func TestADeleteOverHTTP1AfterAnHTTP2AnswerIsNotAFalseSuccess(t *testing.T) {
	var deletes atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	srv.EnableHTTP2 = true
	var handshakes atomic.Int32
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := srv.TLS.Clone()
		cfg.GetConfigForClient = nil
		if handshakes.Add(1)%2 == 1 {
			cfg.NextProtos = []string{"h2", "http/1.1"}
		} else {
			cfg.NextProtos = []string{"http/1.1"}
		}
		return cfg, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	var mu sync.Mutex
	var conns []*failNextWriteConn
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		fc := &failNextWriteConn{Conn: conn}
		mu.Lock()
		conns = append(conns, fc)
		mu.Unlock()
		return fc, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	var protos []string
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	proto := client.WithResponse(func(res *http.Response) { protos = append(protos, res.Proto) })
	_, err = c.Whoami(context.Background(), proto) // over HTTP/2
	require.NoError(t, err)
	tr.CloseIdleConnections()
	_, err = c.Whoami(context.Background(), proto) // over HTTP/1.1: idle in the pool next
	require.NoError(t, err)
	require.Equal(t, []string{"HTTP/2.0", "HTTP/1.1"}, protos)

	mu.Lock()
	conns[len(conns)-1].armed.Store(true) // the HTTP/1.1 connection's next write fails, nothing written
	mu.Unlock()
	err = c.ApprovalWebhooks.Delete(context.Background(), "hook")
	t.Logf("err: %v; deletes the server handled: %d", err, deletes.Load())
	require.EqualValues(t, 1, deletes.Load())
	require.Error(t, err, "no request deleted anything: the only delete the server saw was answered 404")
}

// The same with a Client's first calls made at once over its own HTTP/2
// transport (a worker pool starting up): they share one connection before
// any answer came, and the redelivery whose HEADERS acted is not sent
// again unseen.
func TestConcurrentFirstCallsOverHTTP2DoNotRedeliverTwiceUnseen(t *testing.T) {
	var redeliveries atomic.Int32
	gotGet := make(chan struct{})
	release := make(chan struct{})
	var getOnce sync.Once
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			redeliveries.Add(1)
			time.Sleep(100 * time.Millisecond) // (its answer comes after the connection broke)
			_, _ = io.WriteString(w, `{"id":"0190f0f0-0000-7000-8000-000000000000"}`)
			return
		}
		getOnce.Do(func() {
			close(gotGet)
			select { // (the first Whoami is slow to answer)
			case <-release:
			case <-r.Context().Done():
			}
		})
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	startH2C(srv)
	t.Cleanup(srv.Close)
	defer close(release)

	dial, conns := trackedDial(func(conn net.Conn) *headersThenResetConn { return &headersThenResetConn{Conn: conn} })
	tr := h2cTransport(t, dial)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	whoami := make(chan error, 1)
	go func() { _, err := c.Whoami(context.Background()); whoami <- err }()
	<-gotGet // the first call's stream is open on the connection; no answer yet
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

// Over HTTP/2, a delete whose very first write — the HEADERS frame —
// failed on a reused connection never reached the server: it is sent again
// at once, and the 404 for a webhook that never existed is not found, not
// a success. (The transport reports no failed write of the request then.)
func TestADeleteWhoseHTTP2HeadersNeverWentOutIsNotFound(t *testing.T) {
	var deletes atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	startH2C(srv)
	t.Cleanup(srv.Close)
	dial, conns := trackedDial(func(conn net.Conn) *failNextWriteConn { return &failNextWriteConn{Conn: conn} })
	tr := h2cTransport(t, dial)
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background())
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // (the connection's own writes for Whoami are done)
	for _, fc := range conns() {
		fc.armed.Store(true) // the next write, the delete's HEADERS, fails: nothing goes out
	}
	err = c.ApprovalWebhooks.Delete(context.Background(), "hook")
	t.Logf("err: %v; deletes the server handled: %d", err, deletes.Load())
	require.EqualValues(t, 1, deletes.Load(), "only the retry reached the server")
	require.Error(t, err, "the only delete the server saw was answered 404: nothing was deleted")
}

package httpwork

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
)

// The OpenAPI document (POST /v1/work, a wake-up's work.args) and Args
// list discard_body among the http handler's arguments ("discard_body true
// to keep no response body ... any other key is 400 naming it"), but the
// check at enqueue does not know the key: the work is refused, 400
// "args.discard_body: unknown field". (Webhook deliveries skip the check,
// so their tests pass.)
func TestDiscardBodyIsAcceptedAtEnqueue(t *testing.T) {
	db := testkit.NewPool(t)
	m, err := workpool.New(db, workpool.Config{Pools: map[string]int{"default": 2}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, Register(m, Config{AllowedHosts: []string{"api.example.com"}}))
	_, err = m.Enqueue(context.Background(), workpool.EnqueueParams{OrgID: "o", Pool: "default", Handler: Name,
		Args: json.RawMessage(`{"url": "https://api.example.com/x", "method": "POST", "discard_body": true}`)})
	require.NoError(t, err)
}

// A plain http:// URL is never sent over HTTP/2 (no h2c), and HTTP/1.1
// sends these headers (or, for Transfer-Encoding, leaves it to the
// transport). Work that ran before 129fa93 — including work already
// enqueued, which the handler now fails for good at its next attempt — is
// refused for a limit of a protocol it does not use.
func TestConnectionHeadersAreRefusedOnlyWhereHTTP2CouldCarryTheRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{}`)) }))
	defer srv.Close()
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for _, hdr := range []map[string]string{{"Transfer-Encoding": "identity"}, {"Connection": "keep-alive, TE"}} {
		res, err := run(t, h, context.Background(), Args{URL: srv.URL, Method: "POST", Body: json.RawMessage(`{"a":1}`), Headers: hdr})
		require.NoError(t, err, "%v", hdr)
		require.Equal(t, 200, res.Status)
	}
}

// An http URL may carry connection headers (it is never sent over
// HTTP/2), but its redirect to https may be, with the same headers: the
// HTTP/2 transport then failed every attempt alike, as a retryable network
// error. The redirect is refused for good, before any connection to it.
func TestAConnectionHeaderOnAnHTTPURLRedirectedToHTTPSFailsForGood(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{}`)) }))
	t.Cleanup(tlsSrv.Close)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, tlsSrv.URL+r.URL.Path, http.StatusMovedPermanently)
	}))
	t.Cleanup(plain.Close)
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)
	for _, hdr := range []map[string]string{{"Transfer-Encoding": "identity"}, {"Connection": "keep-alive, TE"}} {
		_, err := run(t, h, context.Background(), Args{URL: plain.URL + "/x", Headers: hdr})
		require.ErrorContains(t, err, "connection header", "%v", hdr)
		require.True(t, workpool.IsNonRetryable(err), "%v: %v", hdr, err)
	}
}

// A 101 Switching Protocols answer hands over the raw connection as the
// body, which no context or timeout ends: reading it held the attempt (its
// goroutine and connection) for as long as the target kept it open. It is
// a failure for good at once.
func TestASwitchedProtocolIsAFailureAtOnce(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		buf.Flush()
		<-release // a peer that says nothing
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	// (an Upgrade is refused at enqueue: the request is built here)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	done := make(chan error, 1)
	go func() {
		_, err := do(&http.Client{}, req, false)
		done <- err
	}()
	select {
	case err := <-done:
		require.True(t, workpool.IsNonRetryable(err), "%v", err)
		require.ErrorContains(t, err, "switched protocols")
	case <-time.After(time.Minute):
		t.Fatal("the handler still reads the switched connection")
	}
}

package httpwork

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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

// A header the HTTP/2 transport refuses (a Connection other than close or
// keep-alive, a Transfer-Encoding other than chunked, a TE other than
// trailers — the last found by review) sends its request
// over HTTP/1.1, on whatever URL: an http one, an https one whose target
// speaks HTTP/2, or an http one redirected to such an https one (a
// redirect keeps the original headers). Refused on https URLs, it refused
// work an HTTP/1.1 target would have taken; let through, HTTP/2 failed
// every attempt alike. Without such a header HTTP/2 is used as before.
// (The handler trusts the system roots, which a process loads once: the
// TLS cases run in a child process whose roots are the test server's.)
func TestAConnectionHeaderSendsItsRequestOverHTTP1(t *testing.T) {
	if os.Getenv("HTTPWORK_CONN_HEADER_CHILD") == "" {
		plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"proto":"` + r.Proto + `"}`)) }))
		defer plain.Close()
		h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
		require.NoError(t, err)
		for _, hdr := range []map[string]string{{"Transfer-Encoding": "identity"}, {"Connection": "keep-alive, TE"}, {"TE": "gzip"}} {
			res, err := run(t, h, context.Background(), Args{URL: plain.URL, Method: "POST", Body: json.RawMessage(`{"a":1}`), Headers: hdr})
			require.NoError(t, err, "%v", hdr)
			require.Equal(t, 200, res.Status)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestAConnectionHeaderSendsItsRequestOverHTTP1$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "HTTPWORK_CONN_HEADER_CHILD=1", "REVEILLE_TEST_DATABASE_URL=postgres://unused/") // (no database needed)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestAConnectionHeaderSendsItsRequestOverHTTP1", "%s", out)
		return
	}
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"proto":"` + r.Proto + `"}`))
	}))
	tlsSrv.EnableHTTP2 = true
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600))
	t.Setenv("SSL_CERT_FILE", ca)
	t.Setenv("SSL_CERT_DIR", t.TempDir())
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, tlsSrv.URL+r.URL.Path, http.StatusMovedPermanently)
	}))
	t.Cleanup(redirect.Close)
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)

	res, err := run(t, h, context.Background(), Args{URL: tlsSrv.URL + "/x"})
	require.NoError(t, err)
	require.JSONEq(t, `{"proto":"HTTP/2.0"}`, string(res.Body), "without a connection header: HTTP/2")
	for _, url := range []string{tlsSrv.URL + "/x", redirect.URL + "/x"} {
		for _, hdr := range []map[string]string{{"Transfer-Encoding": "identity"}, {"Connection": "keep-alive, TE"}, {"TE": "gzip"}} {
			res, err := run(t, h, context.Background(), Args{URL: url, Headers: hdr})
			require.NoError(t, err, "%s %v", url, hdr)
			require.JSONEq(t, `{"proto":"HTTP/1.1"}`, string(res.Body), "%s %v", url, hdr)
		}
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

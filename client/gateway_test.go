package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// gateway forwards every request to target and, whatever the API answers,
// answers status with an HTML body of its own — a load balancer whose
// upstream timeout is shorter than the API's answer time (504), or that
// lost the upstream's answer (502): the API acted, the client never hears
// of it.
func gateway(t *testing.T, target string, status int) *httptest.Server {
	t.Helper()
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err == nil {
			req.Header = r.Header.Clone()
			if res, err := http.DefaultTransport.RoundTrip(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "<html>gateway error</html>")
	}))
	t.Cleanup(gw.Close)
	return gw
}

// A keyed call whose every attempt a gateway answered 502 or 504 (having
// forwarded it) may have been applied: the error says so and names the
// key, and a retry under it acts at most once. Before, the last 5xx came
// back as a plain *Error without the key, and the caller's obvious retry,
// under a new key, spent twice.
func TestAKeyedCallAnswered5xxByAGatewayMayHaveBeenApplied(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	asAdmin := newClient(t, e.url, admin, nil)
	for _, status := range []int{http.StatusBadGateway, http.StatusGatewayTimeout} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			agentID := "gateway-" + http.StatusText(status)
			m, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: agentID, Scope: "s", Budget: 100})
			require.NoError(t, err)
			rec := &recorder{}
			c := newClient(t, gateway(t, e.url, status).URL, agent, rec)

			_, err = c.Mandates.Spend(ctx, client.SpendRequest{AgentID: agentID, Scope: "s", Cost: 10})
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe, "a gateway's %d is a lost answer: %v", status, err)
			require.Equal(t, status, client.StatusOf(err), "the gateway's answer is still there")
			attempts := rec.requests(http.MethodPost, "/v1/mandates/spend")
			require.Len(t, attempts, 4, "retried under its key")
			require.Equal(t, attempts[0].header.Get("Idempotency-Key"), maybe.IdempotencyKey)

			got, err := asAdmin.Mandates.Get(ctx, m.ID)
			require.NoError(t, err)
			require.EqualValues(t, 10, got.Spent, "four attempts under one key spent once")

			var replayed *http.Response
			_, err = newClient(t, e.url, agent, nil).Mandates.Spend(ctx, client.SpendRequest{AgentID: agentID, Scope: "s", Cost: 10},
				client.WithIdempotencyKey(maybe.IdempotencyKey), client.WithResponse(func(r *http.Response) { replayed = r }))
			require.NoError(t, err)
			require.Equal(t, "true", replayed.Header.Get("Idempotent-Replayed"))
			got, err = asAdmin.Mandates.Get(ctx, m.ID)
			require.NoError(t, err)
			require.EqualValues(t, 10, got.Spent, "retried under its key, it acts once")
		})
	}
	t.Run("a GET is not", func(t *testing.T) {
		_, err := newClient(t, gateway(t, e.url, http.StatusGatewayTimeout).URL, agent, nil).Whoami(ctx)
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "%v", err)
		require.Equal(t, http.StatusGatewayTimeout, client.StatusOf(err))
	})
	t.Run("a delete's 404 after a 503 is still not found", func(t *testing.T) {
		// (a load balancer's 503 while its backend is away: nothing was
		// forwarded, so the retry's 404 says the webhook never was — unlike
		// a 404 after a lost answer, whose attempt deleted it)
		proxy := newFaultProxy(t, e.url[len("http://"):])
		proxy.answerUnavailable(1)
		err := newClient(t, proxy.URL(), admin, nil).ApprovalWebhooks.Delete(ctx, "never-existed")
		require.True(t, client.IsNotFound(err), "%v", err)
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe, "the 503 may have come after the delete: it is safe to repeat")
		require.True(t, maybe.Repeatable)
	})
	t.Run("a delete's 404 after an error answer cut in its body is still not found", func(t *testing.T) {
		// (the status line came: the server's 404, or a proxy's 503 that
		// forwarded nothing — only a success cut short hides a deletion)
		proxy := newFaultProxy(t, e.url[len("http://"):])
		rec := &recorder{}
		proxy.cutAnswers(cut{pattern: []byte("\r\n\r\n"), offset: 4 + 10}) // ten bytes of the body
		err := newClient(t, proxy.URL(), admin, rec).ApprovalWebhooks.Delete(ctx, "never-existed")
		require.True(t, client.IsNotFound(err), "%v", err)
		statuses := ids(rec.requests(http.MethodDelete, "/v1/approvals/webhooks/never-existed"), func(r recorded) int { return r.status })
		require.Equal(t, []int{http.StatusNotFound, http.StatusNotFound}, statuses, "the first 404 cut short, then the retry's")
	})
	t.Run("a 501 is not", func(t *testing.T) {
		_, err := newClient(t, gateway(t, e.url, http.StatusNotImplemented).URL, agent, nil).Mandates.Spend(ctx,
			client.SpendRequest{AgentID: "gateway-501", Scope: "s", Cost: 1})
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "no server acts on a method it does not implement: %v", err)
	})
}

// A keyed call whose first answer was a success cut inside its body acted:
// the key's answer is that success. A retry answered anything but its
// replay — a 409, 404 or 422 without Idempotent-Replayed (the key's record
// past its retention, say) — does not settle the call: it may have been
// applied, with its key. Before, such a 409 came back as a plain *Error,
// the call reported failed though it had acted. (A stand-in server: the
// API replays the success while it keeps the key.)
func TestAKeyedCallWhoseSuccessWasCutShortIsSettledOnlyByItsReplay(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusNotFound, http.StatusUnprocessableEntity} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			var attempts atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if attempts.Add(1) == 1 {
					conn, buf, err := http.NewResponseController(w).Hijack()
					require.NoError(t, err)
					_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"id\":\"wk_1")
					_ = buf.Flush()
					conn.Close()
					return
				}
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"type":"about:blank","title":"x","status":`+strconv.Itoa(status)+`}`)
			}))
			t.Cleanup(srv.Close)
			c := newClient(t, srv.URL, agent, nil)
			_, err := c.Wakeups.Create(context.Background(), client.WakeupRequest{AgentID: "a", WorkflowID: orgA + "/w", Signal: "s",
				Scope: "s", Cost: 1, Work: client.WakeupWork{Handler: "http"}})
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe, "%v", err)
			require.NotEmpty(t, maybe.IdempotencyKey)
			require.Equal(t, status, client.StatusOf(err))
			require.EqualValues(t, 2, attempts.Load())
		})
	}
}

// With keep-alives (the default transport), net/http sends a request with
// an Idempotency-Key again by itself when the reused connection it went
// out on closes before any answer: the client never saw the first one's
// answer lost. A keyed request's body now cannot be rewound (see
// TestAKeyedCallWhoseHTTP2StreamWasResetAfterItWasReadMayHaveBeenApplied
// for HTTP/2), so net/http does not send it again and the client's own
// loop sees every lost answer: the call whose first request acted, and
// whose retries met only answers that do not settle its key (the first request still in flight: 409; a rate limit it will not
// wait out: 429), may have been applied, with its key. Before, it was a
// plain *Error — the caller, told it failed, would spend again under a new
// key. (A stand-in server: it drops the first request's connection after
// acting on it.)
func TestAKeyedRequestSentAgainByTheTransportCountsAsALostAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
	}{
		{"in flight", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"https://reveille.dev/problems/idempotency-key-in-flight","title":"in flight","status":409}`)
		}},
		{"rate limited past the wait", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "3600")
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"limited","status":429}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts, acted atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Method == http.MethodGet {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["agent"]}`)
					return
				}
				if posts.Add(1) == 1 {
					acted.Add(1)
					conn, _, err := http.NewResponseController(w).Hijack()
					require.NoError(t, err)
					conn.Close() // no answer at all
					return
				}
				tc.answer(w)
			}))
			t.Cleanup(srv.Close)
			c, err := client.New(srv.URL, client.WithToken("t"),
				client.WithRetry(client.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
			require.NoError(t, err)
			_, err = c.Whoami(context.Background()) // (leaves an idle connection to reuse)
			require.NoError(t, err)

			_, err = c.Mandates.Spend(context.Background(), client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe, "%d requests, %d acted: %v", posts.Load(), acted.Load(), err)
			require.NotEmpty(t, maybe.IdempotencyKey)
			require.Greater(t, posts.Load(), int32(1), "sent again")

			// a keyed call without a body alike (a stream's close)
			posts.Store(0)
			_, err = c.Whoami(context.Background())
			require.NoError(t, err)
			err = c.Streams.Close(context.Background(), "run", "out")
			require.ErrorAs(t, err, &maybe, "%d requests: %v", posts.Load(), err)
			require.NotEmpty(t, maybe.IdempotencyKey)
		})
	}
}

// A keyed call idempotent by nature — a work cancel, a stream's close — is
// safe to repeat, key or no key: MaybeAppliedError says so (Repeatable),
// as for the unkeyed PATCHes and DELETEs. Not a webhook's PUT: its first
// answer alone carries the secret, which only a retry under its key gets
// again.
func TestAKeyedCallIdempotentByNatureIsRepeatable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL, admin, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		call       func() error
		repeatable bool
	}{
		{"Work.Cancel", func() error { _, err := c.Work.Cancel(ctx, "0190f0f0-0000-7000-8000-000000000000"); return err }, true},
		{"Streams.Close", func() error { return c.Streams.Close(ctx, "run", "out") }, true},
		{"ApprovalWebhooks.Put", func() error {
			_, err := c.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: "http://127.0.0.1:9/hook", Format: "json"})
			return err
		}, false},
	} {
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, tc.call(), &maybe, tc.name)
		require.Equal(t, tc.repeatable, maybe.Repeatable, tc.name)
		require.NotEmpty(t, maybe.IdempotencyKey, tc.name)
	}
}

// resettableConns dials connections it can later break: a broken one
// fails every write with nothing sent, as a connection a load balancer
// reset while it sat idle does before the transport notices.
type resettableConns struct {
	mu    sync.Mutex
	conns []*resettableConn
}

type resettableConn struct {
	net.Conn
	broken atomic.Bool
}

func (c *resettableConn) Write(p []byte) (int, error) {
	if c.broken.Load() {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: syscall.ECONNRESET}
	}
	return c.Conn.Write(p)
}

func (r *resettableConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &resettableConn{Conn: conn}
	r.mu.Lock()
	r.conns = append(r.conns, c)
	r.mu.Unlock()
	return c, nil
}

func (r *resettableConns) breakAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.broken.Store(true)
	}
}

// net/http sends a request it could not write at all again on a new
// connection, whatever its method: that request never reached the server,
// so a delete's 404 is still not found — no earlier attempt deleted
// anything. (A review proved that counting the transport's writes made it
// a success.)
func TestADeleteNetHTTPCouldNotWriteOnAResetConnectionIsStillNotFound(t *testing.T) {
	var deletes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"not found","status":404}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["admin"]}`)
	}))
	t.Cleanup(srv.Close)
	conns := &resettableConns{}
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: conns.dial}}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background()) // (leaves an idle connection)
	require.NoError(t, err)
	conns.breakAll()

	err = c.ApprovalWebhooks.Delete(context.Background(), "never-existed")
	require.True(t, client.IsNotFound(err), "%v", err)
	var maybe *client.MaybeAppliedError
	require.False(t, errors.As(err, &maybe), "%v", err)
	require.EqualValues(t, 1, deletes.Load(), "sent again by net/http on a new connection")
}

// A keyed request net/http could not write at all on a reused connection
// (it closed while idle) is sent again at once on a new one, not counted
// as an attempt: with retries disabled the call still gets its answer, as
// before a keyed request's body could no longer be rewound (net/http then
// sent it again itself).
func TestAKeyedRequestNetHTTPCouldNotWriteOnAResetConnectionIsSentAgainAtOnce(t *testing.T) {
	var spends atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			spends.Add(1)
			_, _ = io.WriteString(w, `{"ok":true,"remaining":4}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["agent"]}`)
	}))
	t.Cleanup(srv.Close)
	conns := &resettableConns{}
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: conns.dial}}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	_, err = c.Whoami(context.Background()) // (leaves an idle connection)
	require.NoError(t, err)
	conns.breakAll()

	_, err = c.Mandates.Spend(context.Background(), client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
	requireSentAgainOrSaidMaybe(t, err, spends.Load())
}

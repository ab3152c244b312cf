package httpwork

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool"
)

// docs/security.md: with "discard_body": true "a 2xx succeeds whatever its
// length, and no body is kept" — the status is all such work (an approval
// webhook's delivery) needs. Yet the handler still reads the body it
// discards, so a 2xx whose body ends early or drips past the attempt's
// timeout fails the attempt (retryable): the receiver, which took the
// request and answered 200, is sent it again, and the slot is held for the
// whole timeout in the meantime.
func TestA2xxWithDiscardBodySucceedsWhateverItsBodyDoes(t *testing.T) {
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)

	t.Run("a body cut short", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok")
			buf.Flush()
		}))
		t.Cleanup(srv.Close)
		res, err := run(t, h, context.Background(), Args{URL: srv.URL, Method: "POST", DiscardBody: true})
		require.NoError(t, err, "the target answered 200")
		require.Equal(t, http.StatusOK, res.Status)
	})

	t.Run("a body that drips past the timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("accepted"))
			http.NewResponseController(w).Flush()
			<-release // the rest of the body comes after the test
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		// (the attempt's timeout: a run that waits for the body, which ends
		// only after the test, fails with it, whatever the machine's speed)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := run(t, h, ctx, Args{URL: srv.URL, Method: "POST", DiscardBody: true})
		require.NoError(t, err, "the target answered 200; the attempt waited for a body it discards")
		require.Equal(t, http.StatusOK, res.Status)
	})
}

// The handler's doc: "any other status fails for good", keeping a snippet
// (512 bytes) of its body. A 4xx whose body ends early, or drips past the
// attempt's timeout, is a network error instead — retried per the work's
// policy (10 times over 40 minutes for a webhook delivery), each attempt
// holding its slot until the timeout — for a body of which 512 bytes are
// kept.
func TestA4xxFailsForGoodWhateverItsBodyDoes(t *testing.T) {
	h, err := New(Config{AllowedHosts: []string{"127.0.0.1:*"}})
	require.NoError(t, err)

	t.Run("a body cut short", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			buf.WriteString("HTTP/1.1 404 Not Found\r\nContent-Length: 100\r\n\r\nno such hook")
			buf.Flush()
		}))
		t.Cleanup(srv.Close)
		_, err := run(t, h, context.Background(), Args{URL: srv.URL})
		var se *StatusError
		require.ErrorAs(t, err, &se)
		require.Equal(t, http.StatusNotFound, se.Status)
		require.True(t, workpool.IsNonRetryable(err), "a 404 fails for good: %v", err)
	})

	t.Run("a body that drips past the timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(strings.Repeat("denied ", 100)))
			http.NewResponseController(w).Flush()
			<-release // the rest of the body comes after the test
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := run(t, h, ctx, Args{URL: srv.URL})
		var se *StatusError
		require.ErrorAs(t, err, &se, "%v", err)
		require.Equal(t, http.StatusForbidden, se.Status)
		require.True(t, workpool.IsNonRetryable(err), "a 403 fails for good: %v", err)
	})
}

// A Host header among the work's headers is refused at enqueue, naming
// it. It was taken and then silently not sent (net/http writes req.Host,
// never Header["Host"]): work aimed at a virtual host behind an allowed
// address reached the default host and succeeded with its answer. (Sent,
// it would reach any virtual host behind an allowed name's address.)
func TestAHostHeaderIsRefusedNamingIt(t *testing.T) {
	list, err := ParseAllowList([]string{"127.0.0.1:*"})
	require.NoError(t, err)
	for _, name := range []string{"Host", "host", "HOST"} {
		raw, err := json.Marshal(Args{URL: "http://127.0.0.1:8080/", Headers: map[string]string{name: "billing.internal"}})
		require.NoError(t, err)
		var refused []string
		CheckArgs(list)(raw, func(field, _ string) { refused = append(refused, field) })
		require.Equal(t, []string{"headers." + name}, refused)
	}
}

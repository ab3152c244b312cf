package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A call net/http stops redirecting ("stopped after 10 redirects": here
// something in front of the API sends every request back to itself) fails
// at once, saying it was redirected and where — not "reading the 307
// answer", a lost answer marked maybe-applied: every answer was a 3xx,
// which the API never gives, so nothing acted on the request. Only an
// earlier attempt whose answer was lost still makes the call
// maybe-applied.
func TestARedirectNotFollowedIsNotALostAnswer(t *testing.T) {
	ctx := context.Background()
	// loop answers every request a 307 to /loop, after dropping the first
	// lost requests without an answer (it read them whole: they may have
	// acted).
	loop := func(t *testing.T, lost int32) (url string, requests *atomic.Int32) {
		t.Helper()
		requests = &atomic.Int32{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if requests.Add(1) <= lost {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			http.Redirect(w, r, "/loop", http.StatusTemporaryRedirect)
		}))
		t.Cleanup(srv.Close)
		return srv.URL, requests
	}
	requireRedirected := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorContains(t, err, "POST /v1/runs/r/streams/out/chunks: answered 307 Temporary Redirect redirecting to \"/loop\", not followed")
		require.ErrorContains(t, err, "stopped after 10 redirects")
		require.NotContains(t, err.Error(), "reading the")
		var urlErr *url.Error
		require.ErrorAs(t, err, &urlErr, "net/http's error is still there")
		require.Zero(t, client.StatusOf(err), "a 3xx is not an *Error")
	}
	for _, tc := range []struct {
		name string
		opts []client.CallOption
	}{
		{"with its Idempotency-Key", nil},
		{"without one", []client.CallOption{client.WithoutIdempotencyKey()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, requests := loop(t, 0)
			var final *http.Response
			opts := append([]client.CallOption{client.WithResponse(func(r *http.Response) { final = r })}, tc.opts...)
			_, err := newClient(t, url, agent, nil).Streams.Append(ctx, "r", "out", []byte("x"), opts...)
			requireRedirected(t, err)
			var maybe *client.MaybeAppliedError
			require.False(t, errors.As(err, &maybe), "a 3xx answer: nothing acted on it: %v", err)
			require.EqualValues(t, 10, requests.Load(), "one attempt (the request and the 9 redirects followed), not retried")
			require.Nil(t, final, "no whole answer to hand WithResponse")
		})
	}
	t.Run("after an attempt whose answer was lost it is maybe-applied", func(t *testing.T) {
		url, requests := loop(t, 1)
		_, err := newClient(t, url, agent, nil).Streams.Append(ctx, "r", "out", []byte("x"))
		requireRedirected(t, err)
		var maybe *client.MaybeAppliedError
		require.ErrorAs(t, err, &maybe, "the first attempt may have acted")
		require.NotEmpty(t, maybe.IdempotencyKey)
		require.EqualValues(t, 1+10, requests.Load())
	})
}

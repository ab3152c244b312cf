package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A redirected call (here something in front of the API sends every
// request back to itself) fails at once, saying it was redirected and
// where — not "reading the 307 answer", a lost answer marked
// maybe-applied: every answer was a 3xx, which the API never gives, so
// nothing acted on the request. Only an earlier attempt whose answer was
// lost still makes the call maybe-applied. The client follows no redirect
// (its own http.Client, or a copy of the caller's without a CheckRedirect);
// a 307 or 308 to a call that must not act twice unseen (a POST: its body
// cannot be rewound) not even with a CheckRedirect of the caller's.
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
		require.ErrorContains(t, err, "a call that must not act twice is not sent on to another URL")
		require.NotContains(t, err.Error(), "reading the")
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
			require.EqualValues(t, 1, requests.Load(), "one attempt, its redirect not followed, not retried")
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
		require.EqualValues(t, 1+1, requests.Load())
	})
}

// Following a redirect is never right for this API: net/http would turn a
// POST answered 302 into a bodyless GET, whose 200 would pass for the
// create's answer — nothing created, no error — and would send the bearer
// token on to another port of the same host. A caller's http.Client with
// a CheckRedirect of its own keeps it.
func TestTheClientFollowsNoRedirect(t *testing.T) {
	ctx := context.Background()
	var gets, tokens atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			tokens.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(other.Close)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/created":
			gets.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"not-created","state":"pending"}`))
		case "/v1/wakeups":
			http.Redirect(w, r, "/created", http.StatusFound)
		default:
			http.Redirect(w, r, other.URL+"/elsewhere", http.StatusTemporaryRedirect)
		}
	}))
	t.Cleanup(front.Close)

	c := newClient(t, front.URL, agent, nil)
	_, err := c.Wakeups.Create(ctx, client.WakeupRequest{AgentID: "a", WorkflowID: "o/wf", Signal: "s", Scope: "x", Cost: 1,
		Work: client.WakeupWork{Handler: "h"}})
	require.ErrorContains(t, err, `answered 302 Found redirecting to "/created", not followed`)
	require.Zero(t, gets.Load(), "the POST was sent on as a GET")

	_, err = c.Pools.Get(ctx, "default")
	require.ErrorContains(t, err, "answered 307 Temporary Redirect")
	require.Zero(t, tokens.Load(), "the token went to another port")

	follows := newClient(t, front.URL, agent, nil, client.WithHTTPClient(&http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}))
	_, err = follows.Pools.Get(ctx, "default")
	require.ErrorContains(t, err, "the 200 answer of GET /elsewhere has no body", "an empty answer passed for a pool")
	require.EqualValues(t, 1, tokens.Load(), "the caller's own redirect policy was not kept")
}

// A 307 or 308 to a call that must not act twice unseen (a POST: its body
// cannot be rewound, so that net/http never sends it again by itself) is
// not followed even by a caller's CheckRedirect that follows redirects —
// key or no key, body or none: the error says why. A GET still follows it.
func TestACallThatMustNotActTwiceIsNotRedirectedEvenWhenTheCallersPolicyFollows(t *testing.T) {
	var moved atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			http.Redirect(w, r, "/api"+r.URL.Path, http.StatusPermanentRedirect)
			return
		}
		moved.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"org_id":"o","sub":"s","roles":["agent"],"ok":true,"remaining":4}`))
	}))
	t.Cleanup(srv.Close)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(hc))
	require.NoError(t, err)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"keyed": func() error {
			_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
			return err
		},
		"without its key": func() error {
			_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1}, client.WithoutIdempotencyKey())
			return err
		},
		"keyed without a body": func() error { return c.Streams.Close(ctx, "r", "out") },
	} {
		err := call()
		require.ErrorContains(t, err, "answered 308 Permanent Redirect", name)
		require.ErrorContains(t, err, "a call that must not act twice is not sent on to another URL", name)
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "%s: %v", name, err)
	}
	require.Zero(t, moved.Load())
	_, err = c.Whoami(ctx)
	require.NoError(t, err, "a GET follows the caller's policy")
	require.EqualValues(t, 1, moved.Load())
}

// A redirect the caller's CheckRedirect chose to stop at
// (http.ErrUseLastResponse) is that answer, its status an *Error's as
// before — not worded as the client's refusal.
func TestARedirectTheCallersPolicyStoppedAtIsItsStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	c, err := client.New(srv.URL, client.WithToken("t"), client.WithHTTPClient(hc))
	require.NoError(t, err)
	_, err = c.Work.Get(context.Background(), "0190f0f0-0000-7000-8000-000000000000")
	require.Equal(t, http.StatusFound, client.StatusOf(err), "%v", err)
	require.NotContains(t, err.Error(), "follows no redirect")
}

package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// headerServer answers every request 201 {} and keeps the last one.
func headerServer(t *testing.T) (url string, last func() *http.Request) {
	t.Helper()
	var mu sync.Mutex
	var seen *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Clone(context.Background())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() *http.Request {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// WithHeader("Idempotency-Key", k) is WithIdempotencyKey(k): the call
// sends one key, the caller's — not the generated one beside it, which the
// server would have read first.
func TestAnIdempotencyKeyGivenAsAHeaderIsTheCallsOneKey(t *testing.T) {
	ctx := context.Background()
	url, last := headerServer(t)
	c, err := client.New(url, client.WithToken("t"))
	require.NoError(t, err)
	for _, name := range []string{"Idempotency-Key", "idempotency-key"} {
		_, err = c.Mandates.Spend(ctx, client.SpendRequest{}, client.WithHeader(name, "mine"))
		require.NoError(t, err)
		require.Equal(t, []string{"mine"}, last().Header.Values("Idempotency-Key"), name)
	}
	_, err = c.Mandates.Spend(ctx, client.SpendRequest{}, client.WithHeader("X-Trace", "a"))
	require.NoError(t, err)
	require.Len(t, last().Header.Values("Idempotency-Key"), 1, "a key generated")
	require.Equal(t, "a", last().Header.Get("X-Trace"), "other headers are added")
}

// A base URL the calls' paths cannot follow is refused when the client is
// made, naming what is wrong — not sent to //v1/… with its query dropped,
// or to no host at all; a path prefix is kept, its trailing slashes
// dropped.
func TestNewRefusesABaseURLWithoutAHostOrWithAQueryOrFragment(t *testing.T) {
	for _, tc := range []struct{ url, why string }{
		{"http://", "names no host"},
		{"http:///v1", "names no host"},
		{"https://?x=1", "names no host"},
		{"http://127.0.0.1:8080/?x=1", "may not have a query or a fragment"},
		{"http://127.0.0.1:8080?", "may not have a query or a fragment"},
		{"http://127.0.0.1:8080/api#top", "may not have a query or a fragment"},
		{"http://127.0.0.1:8080/#", "may not have a query or a fragment"},
		{"ftp://127.0.0.1", "the scheme must be http or https"},
	} {
		_, err := client.New(tc.url)
		require.ErrorContains(t, err, tc.why, tc.url)
		require.ErrorContains(t, err, tc.url, "the error names the URL")
	}

	url, last := headerServer(t)
	for base, want := range map[string]string{url: "/v1/whoami", url + "/": "/v1/whoami", url + "/api//": "/api/v1/whoami"} {
		c, err := client.New(base)
		require.NoError(t, err, base)
		_, err = c.Whoami(context.Background())
		require.NoError(t, err)
		require.Equal(t, want, last().URL.Path, base)
	}
}

// A nil Option or CallOption is ignored, not a panic.
func TestNilOptionsAreIgnored(t *testing.T) {
	url, last := headerServer(t)
	c, err := client.New(url, nil, client.WithToken("t"), nil)
	require.NoError(t, err)
	_, err = c.Whoami(context.Background(), nil, client.WithHeader("X-Trace", "a"), nil)
	require.NoError(t, err)
	require.Equal(t, "a", last().Header.Get("X-Trace"))
	require.Equal(t, "Bearer t", last().Header.Get("Authorization"))
	for _, err := range c.Streams.Tail(context.Background(), "run", "out", client.TailParams{}, nil) {
		require.Equal(t, http.StatusCreated, client.StatusOf(err), "the call was made: %v", err)
	}
}

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

// headerServer answers every request 201 {} and keeps the headers of the
// last one.
func headerServer(t *testing.T) (url string, last func() http.Header) {
	t.Helper()
	var mu sync.Mutex
	var seen http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() http.Header {
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
		require.Equal(t, []string{"mine"}, last().Values("Idempotency-Key"), name)
	}
	_, err = c.Mandates.Spend(ctx, client.SpendRequest{}, client.WithHeader("X-Trace", "a"))
	require.NoError(t, err)
	require.Len(t, last().Values("Idempotency-Key"), 1, "a key generated")
	require.Equal(t, "a", last().Get("X-Trace"), "other headers are added")
}

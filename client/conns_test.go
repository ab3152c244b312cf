package client_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// One client shared by many goroutines, as the package asks, reuses a
// connection per concurrent caller: net/http's default transport kept two
// idle connections per host, and every call past them dialled a new one
// (the reviewer's 32 goroutines: 369 connections in 3 s). The server is a
// stand-in: what is measured is the client's transport.
func TestASharedClientReusesItsConnectionsAcrossConcurrentCallers(t *testing.T) {
	var dialled atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"org_id":"o","sub":"s","roles":["agent"]}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithToken("t"))
	require.NoError(t, err)

	// (a connection is closed only when the idle ones are at their bound,
	// 64, so no more can ever be dialled: without it, ~1 call in 10 dialled)
	const callers, calls = 16, 200
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range calls {
				_, err := c.Whoami(context.Background())
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, dialled.Load(), int64(64), "%d connections for %d callers' %d calls", dialled.Load(), callers, callers*calls)
}

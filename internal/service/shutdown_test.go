package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
)

// A client still sending its request body when the replica is told to
// stop (a slow upload, within REVEILLE_READ_TIMEOUT) must not turn a
// SIGTERM into a failed exit: docs/operations.md § Draining a replica says
// the process exits 0 once the drain is over.
func TestAStopWithASlowClientStillReturnsNil(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.API.ShutdownTimeout = 2 * time.Second // the API's drain bound (default 15 s), short for the test
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	defer svc.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	addr := make(chan string, 1)
	go func() { done <- svc.Run(runCtx, func(a net.Addr) { addr <- a.String() }) }()
	a := <-addr

	// Headers sent, the body not yet: the request is in flight.
	conn, err := net.Dial("tcp", a)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	require.NoError(t, err)
	// (the server holds it: it and the scrape's own are open)
	scrape := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	require.Eventually(t, func() bool {
		res, err := scrape.Get("http://" + a + "/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return strings.Contains(string(b), "\nreveille_http_open_connections 2\n")
	}, 10*time.Second, 20*time.Millisecond, "the slow request's connection is open")

	stop()
	select {
	case err := <-done:
		require.NoError(t, err, "a stop ends Run with nil (the process exits 0)")
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return")
	}
}

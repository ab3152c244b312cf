package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A caller that cancels a live tail of a quiet stream (open, no chunk yet)
// gets its context's error: the server answered 200 and the connection was
// fine, so the error must not report a failed connection attempt or an
// outage that never happened.
func TestCancelingAQuietTailIsNotReportedAsAFailedConnection(t *testing.T) {
	e := startEngine(t)
	reader := newClient(t, e.url, approver, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var last error
	for _, err := range reader.Streams.Tail(ctx, "run", "quiet", client.TailParams{}) {
		last = err
	}
	require.ErrorIs(t, last, context.Canceled)
	require.NotContains(t, last.Error(), "connection attempt failed", "the connection was open (200): %v", last)
	require.NotContains(t, last.Error(), "no healthy connection", "%v", last)
}

// Same, when the caller cancels while the server has not answered yet (a
// busy engine, a proxy that buffers): the attempt did not fail, the caller
// ended it; the error must be the context's, not "1 connection attempt
// failed". (The test above meets this state whenever the engine takes
// longer than its 300 ms to answer the tail's request.)
func TestCancelingATailBeforeTheServerAnsweredIsNotReportedAsAFailedConnection(t *testing.T) {
	srv := newSSEServer(t, func(w http.ResponseWriter) { time.Sleep(2 * time.Second) })
	reader := newClient(t, srv.url, approver, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var last error
	for _, err := range reader.Streams.Tail(ctx, "run", "quiet", client.TailParams{}) {
		last = err
	}
	require.ErrorIs(t, last, context.Canceled)
	require.NotContains(t, last.Error(), "connection attempt failed", "the caller canceled; no attempt failed: %v", last)
}

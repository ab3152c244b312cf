package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A caller that cancels a live tail of a quiet stream gets its context's
// error, not a failed connection attempt or an outage that never happened:
// whether the server answered 200 and sent nothing yet (the connection was
// fine), or had not answered yet (a busy engine, a proxy that buffers: the
// caller ended the attempt, it did not fail).
func TestCancelingAQuietTailIsNotReportedAsAFailedConnection(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"answered": func(t *testing.T) string { return startEngine(t).url },
		"not answered": func(t *testing.T) string {
			return newSSEServer(t, func(http.ResponseWriter) { time.Sleep(2 * time.Second) }).url
		},
	} {
		t.Run(name, func(t *testing.T) {
			reader := newClient(t, url(t), approver, nil)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			var last error
			for _, err := range reader.Streams.Tail(ctx, "run", "quiet", client.TailParams{}) {
				last = err
			}
			require.ErrorIs(t, last, context.Canceled)
			require.NotContains(t, last.Error(), "connection attempt failed", "%v", last)
			require.NotContains(t, last.Error(), "no healthy connection", "%v", last)
		})
	}
}

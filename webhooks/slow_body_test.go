package webhooks

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// docs/approvals.md: "a 2xx answer is delivered". A receiver that takes the
// event, answers 200 at once and then finishes its response slowly (a
// framework that flushes the status before its handler returns, a proxy
// that holds the connection) has its delivery fail at the attempt's
// timeout and sent again: the receiver hears of one event several times,
// and the webhook's last_failure says it was not delivered.
func TestA2xxWhoseBodyIsSlowIsADeliveryOnce(t *testing.T) {
	// (an attempt's timeout well past any scheduling delay, and a body that
	// never ends while the test runs: only a delivery that waits for the
	// body fails, whatever the machine's speed)
	f := newFixture(t, func(c *Config) { c.TimeoutMS = 5000 })
	ctx := context.Background()
	var got atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("accepted"))
		http.NewResponseController(w).Flush()
		<-release // the rest of its answer comes after the test
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	f.put(t, orgA, "ops", srv.URL, FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	var w Webhook
	require.Eventually(t, func() bool {
		var err error
		w, err = f.store.Get(ctx, orgA, "ops")
		require.NoError(t, err)
		return w.LastDelivery != nil
	}, testWait, 10*time.Millisecond, "no delivery recorded: the attempts waited for the body")
	require.EqualValues(t, 1, got.Load(), "the receiver answered 200 to the first request")
	require.Equal(t, "succeeded", w.LastDelivery.Outcome, "error: %s", w.LastDelivery.Error)
}

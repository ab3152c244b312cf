package webhooks

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool"
)

// A receiver that moved (301 to its new path, as an http→https or a
// trailing-slash redirect does) answers the delivery's POST with a
// redirect. Followed, it became a GET without the body, the new path
// answered 200, and the delivery was recorded succeeded although the
// receiver never got the event. The delivery now fails for good, saying
// why, and the admin sees it in last_failure.
func TestARedirectThatWouldDropTheBodyFailsTheDelivery(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusMovedPermanently)
			return
		}
		gets.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	f.put(t, orgA, "ops", srv.URL+"/old", FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))

	var w Webhook
	require.Eventually(t, func() bool {
		var err error
		w, err = f.store.Get(ctx, orgA, "ops")
		require.NoError(t, err)
		return w.LastDelivery != nil
	}, testWait, 10*time.Millisecond)
	require.Equal(t, "failed", w.LastDelivery.Outcome)
	require.NotNil(t, w.LastFailure)
	require.Contains(t, w.LastFailure.Error, "redirect to "+srv.URL+"/new refused: it would send the POST again as a GET without its body")
	require.Zero(t, gets.Load(), "nothing followed the redirect")
}

// A webhook deleted while a delivery of it runs, then created again under
// the same name (a new secret, a new URL), takes the old delivery's
// failure as its own: the new webhook shows a last_failure at a URL it
// never had, of an event it never got.
func TestARecreatedWebhookDoesNotTakeTheDeletedOnesDeliveries(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Retry = &workpool.RetryPolicy{MaxAttempts: 1, InitialBackoffMS: 10, Base: 1} })
	ctx := context.Background()
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		http.Error(w, "gone", http.StatusInternalServerError)
	}))
	t.Cleanup(old.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	f.put(t, orgA, "ops", old.URL+"/old", FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	select {
	case <-arrived:
	case <-time.After(testWait):
		t.Fatal("the delivery never arrived")
	}
	require.NoError(t, f.store.Delete(ctx, orgA, "ops"))
	fresh := newReceiver(t, 0)
	require.True(t, f.put(t, orgA, "ops", fresh.srv.URL+"/new", FormatJSON).Created)
	close(release)

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE org_id = $1 AND state = 'finished'`, orgA).Scan(&n))
		return n == 1
	}, testWait, 10*time.Millisecond) // (recorded in the transaction that finished it)
	w, err := f.store.Get(ctx, orgA, "ops")
	require.NoError(t, err)
	if w.LastFailure != nil {
		t.Logf("the new webhook (url %s) shows last_failure %+v", w.URL, *w.LastFailure)
	}
	require.Nil(t, w.LastDelivery, "the new webhook has had no delivery")
	require.Nil(t, w.LastFailure, "the new webhook has had no failure")
}

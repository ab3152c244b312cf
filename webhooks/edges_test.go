package webhooks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool"
)

// An org has at most MaxPerOrg webhooks (the API's "a 21st webhook is
// 409"). Creates sent together (a script registering an org's hooks in
// parallel) each count the others as absent and all insert: the org ends
// with far more than the cap, and every event enqueues a delivery to each.
func TestConcurrentCreatesDoNotPassMaxPerOrg(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const n = 3 * MaxPerOrg
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = f.store.Put(ctx, orgA, fmt.Sprint("hook-", i), PutParams{URL: "http://127.0.0.1:9/hook", Format: FormatJSON})
		}()
	}
	close(start)
	wg.Wait()
	refused := 0
	for _, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, ErrTooMany)
			refused++
		}
	}
	list, err := f.store.List(ctx, orgA)
	require.NoError(t, err)
	require.LessOrEqual(t, len(list), MaxPerOrg, "%d creates sent together: %d refused, the org has %d webhooks", n, refused, len(list))
}

// A delivery's record is written by its onComplete hook; a hook call that
// fails (here: its statement waits past the hook timeout on a lock held on
// the webhook's row) is retried by the pool later. The retry records the
// older delivery over the newer one that finished and was recorded in the
// meantime: last_delivery names seq 1 (failed) although seq 2 finished
// after it and succeeded, and its finished_at is when the hook was
// retried, not when the delivery finished (GET /v1/work/{id}).
func TestARetriedHookDoesNotRecordAnOlderDeliveryOverANewerOne(t *testing.T) {
	f := newFixtureWithPool(t, workpool.Config{HookTimeout: 200 * time.Millisecond, HookRetryBackoff: 2 * time.Second},
		func(c *Config) { c.Retry = &workpool.RetryPolicy{MaxAttempts: 1, InitialBackoffMS: 10, Base: 1} })
	ctx := context.Background()
	rcv := newReceiver(t, 1) // (the first delivery fails: 500)
	f.put(t, orgA, "ops", rcv.srv.URL, FormatJSON)

	finished := func(n int) func() bool {
		return func() bool {
			var got int
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE org_id = $1 AND state = 'finished'`, orgA).Scan(&got))
			return got == n
		}
	}
	// Another completion transaction holds the webhook's row (its own
	// delivery's hook updated it, and other hooks of its batch are still
	// running) while seq 1's delivery finishes.
	lock, err := f.db.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `UPDATE approval_webhooks SET last_delivery = last_delivery WHERE org_id = $1 AND name = 'ops'`, orgA)
	require.NoError(t, err)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	require.Eventually(t, finished(1), testWait, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		var retry bool
		require.NoError(t, f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workpool_work WHERE org_id = $1 AND hook_state = 'retry')`, orgA).Scan(&retry))
		return retry
	}, testWait, 10*time.Millisecond, "seq 1's hook timed out and waits for its retry")
	require.NoError(t, lock.Rollback(ctx))

	// Seq 2 is delivered, and recorded, while seq 1's hook waits.
	f.emit(t, toolEvent(orgA, 2, TypeResolved, approvedCall))
	rcv.await(t, 1)
	var w Webhook
	require.Eventually(t, func() bool {
		w, err = f.store.Get(ctx, orgA, "ops")
		require.NoError(t, err)
		return w.LastDelivery != nil && w.LastDelivery.Seq == 2
	}, testWait, 10*time.Millisecond)

	// Seq 1's hook is retried.
	require.Eventually(t, func() bool {
		var pending bool
		require.NoError(t, f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workpool_work WHERE org_id = $1 AND hook_state = 'retry')`, orgA).Scan(&pending))
		return !pending
	}, testWait, 10*time.Millisecond)
	w, err = f.store.Get(ctx, orgA, "ops")
	require.NoError(t, err)
	var seq1Finished, seq2Finished time.Time
	require.NoError(t, f.db.QueryRow(ctx, `SELECT finished_at FROM workpool_work WHERE id = $1`, w.LastFailure.WorkID).Scan(&seq1Finished))
	require.NoError(t, f.db.QueryRow(ctx, `SELECT finished_at FROM workpool_work WHERE org_id = $1 AND id <> $2`, orgA, w.LastFailure.WorkID).Scan(&seq2Finished))
	t.Logf("work: seq 1 finished %s, seq 2 finished %s; last_delivery %+v", seq1Finished.UTC(), seq2Finished.UTC(), *w.LastDelivery)
	require.EqualValues(t, 1, w.LastFailure.Seq, "seq 1's failure is recorded")
	require.EqualValues(t, 2, w.LastDelivery.Seq, "the delivery that finished last is seq 2, which succeeded")
	require.Equal(t, "succeeded", w.LastDelivery.Outcome)
}

// docs/approvals.md: "a 2xx answer is delivered". A receiver that takes the
// event and answers 200 with a large page (an HTML error page of a proxy, a
// debug echo) has the delivery recorded as failed — for good, so its
// last_failure says the event was not delivered although it was.
func TestA2xxAnswerWithALargeBodyIsADelivery(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		got.Add(1)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(strings.Repeat("x", 2<<20)))
	}))
	t.Cleanup(srv.Close)
	f.put(t, orgA, "ops", srv.URL, FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	var w Webhook
	require.Eventually(t, func() bool {
		var err error
		w, err = f.store.Get(ctx, orgA, "ops")
		require.NoError(t, err)
		return w.LastDelivery != nil
	}, testWait, 10*time.Millisecond)
	require.EqualValues(t, 1, got.Load(), "the receiver took the event once")
	require.Equal(t, "succeeded", w.LastDelivery.Outcome, "error: %s", w.LastDelivery.Error)
	require.Nil(t, w.LastFailure)
}

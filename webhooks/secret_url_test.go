package webhooks

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// A Slack webhook's URL is its secret (docs/approvals.md: "its URL is its
// secret, so keep the webhook list to admins"). A delivery that fails for
// good on a network error must not write that URL to the operator's log.
func TestASlackWebhooksURLIsNotLoggedWhenItsDeliveryFails(t *testing.T) {
	var logs testkit.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	db := testkit.NewPool(t)
	pool, err := workpool.New(db, workpool.Config{Logger: logger, Cooldown: 50 * time.Millisecond,
		LeaderRetry: 50 * time.Millisecond, StopGrace: time.Second})
	require.NoError(t, err)
	require.NoError(t, httpwork.Register(pool, allowLocal))
	require.NoError(t, pool.Start(context.Background()))
	t.Cleanup(func() { _ = pool.Stop(context.Background()) })
	rules, err := httpwork.NewURLRules(allowLocal)
	require.NoError(t, err)
	f := fixture{store: New(db, pool, Config{CheckURL: rules.CheckURL, Retry: &workpool.RetryPolicy{MaxAttempts: 1}}), db: db, pool: pool}

	// A port nobody listens on: the delivery fails with "connection refused".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	const token = "XoXbS3cr3tT0k3nInThePath"
	f.put(t, orgA, "slack", "http://"+addr+"/services/T000/B000/"+token, FormatSlack)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))

	ctx := context.Background()
	require.Eventually(t, func() bool {
		w, err := f.store.Get(ctx, orgA, "slack")
		require.NoError(t, err)
		return w.LastFailure != nil
	}, testWait, 10*time.Millisecond)
	require.Eventually(t, func() bool { return bytes.Contains([]byte(logs.String()), []byte("work failed for good")) },
		testWait, 10*time.Millisecond)
	require.NotContains(t, logs.String(), token, "the Slack webhook's secret URL is in the log")
}

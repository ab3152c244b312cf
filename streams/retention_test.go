package streams_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/streams"
)

func TestPurgeDeletesOnlyStreamsClosedBeforeTheCutoffInBatches(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The background loop keeps ten years, so only the explicit call purges.
	svc, db := newService(t, streams.Config{PurgeBatch: 2, Registry: reg, Retention: 10 * 365 * 24 * time.Hour})
	ctx := context.Background()
	for i := range 5 {
		name := fmt.Sprint("old-", i)
		mustAppend(t, svc, org, "run-1", name, "a", "b", "c", "d", "e")
		for k := range 3 {
			_, err := svc.AppendWithKey(ctx, org, "run-1", name, fmt.Sprint("key-", k), [][]byte{[]byte("keyed")})
			require.NoError(t, err)
		}
		require.NoError(t, svc.Close(ctx, org, "run-1", name))
	}
	mustAppend(t, svc, otherOrg, "run-1", "old-other-org", "a", "b", "c")
	require.NoError(t, svc.Close(ctx, otherOrg, "run-1", "old-other-org"))
	_, err := db.Exec(ctx, `UPDATE streams SET closed_at = now() - interval '8 days'`)
	require.NoError(t, err)

	mustAppend(t, svc, org, "run-1", "open", "a", "b", "c")
	mustAppend(t, svc, org, "run-1", "recent", "a", "b")
	require.NoError(t, svc.Close(ctx, org, "run-1", "recent"))

	n, err := svc.PurgeClosedBefore(ctx, time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 6, n, "every org's expired streams")
	require.Equal(t, 6.0, metricValue(t, reg, "reveille_streams_purged_total"))

	names, err := svc.ListNames(ctx, org, "run-1", "", 50)
	require.NoError(t, err)
	require.Equal(t, []string{"open", "recent"}, names.Names)
	require.Len(t, readAll(t, svc, org, "run-1", "open", 50), 3)
	require.Len(t, readAll(t, svc, org, "run-1", "recent", 50), 2)
	var orphans int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM stream_chunks c WHERE NOT EXISTS (SELECT 1 FROM streams s WHERE s.id = c.stream_id)`).Scan(&orphans))
	require.Zero(t, orphans, "no chunk outlives its stream")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM stream_appends`).Scan(&orphans))
	require.Zero(t, orphans, "nor does an append key")

	n, err = svc.PurgeClosedBefore(ctx, time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	require.Zero(t, n, "a second pass finds nothing")
}

func TestTheRetentionLoopPurgesExpiredStreamsInTheBackground(t *testing.T) {
	svc, _ := newService(t, streams.Config{Retention: time.Millisecond, PurgeInterval: 10 * time.Millisecond, LeaderRetry: 10 * time.Millisecond})
	ctx := context.Background()
	mustAppend(t, svc, org, "run-1", "done", "a", "b")
	require.NoError(t, svc.Close(ctx, org, "run-1", "done"))
	mustAppend(t, svc, org, "run-1", "open", "a")

	require.Eventually(t, func() bool {
		info, err := svc.Info(ctx, org, "run-1", "done")
		return err == nil && info.TailIndex == -1 && !info.Done
	}, testWait, pollTick, "the closed stream is purged")
	info, err := svc.Info(ctx, org, "run-1", "open")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: 0}, info, "an open stream is never purged")
}

// A retention loop whose replica lost the leadership without noticing yet
// (another replica started a newer term) deletes nothing, not even a
// stream's chunks; the current leader's purge does.
func TestADeposedLeadersPurgeWritesNothing(t *testing.T) {
	svc, db := newService(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour}) // the background loop purges nothing
	ctx := context.Background()
	mustAppend(t, svc, org, "run-1", "done", "a", "b")
	require.NoError(t, svc.Close(ctx, org, "run-1", "done"))
	// The service's own retention loop takes its term first, so that no
	// term of its own lands after the two below (on a loaded machine it
	// could campaign late and depose "current").
	require.Eventually(t, func() bool {
		var terms int64
		err := db.QueryRow(ctx, `SELECT term FROM leader_terms WHERE name = $1`, streams.RetentionLeadership).Scan(&terms)
		return err == nil && terms >= 1
	}, testWait, pollTick, "the service's retention loop leads")
	deposed, err := leader.NewTerm(ctx, db, streams.RetentionLeadership)
	require.NoError(t, err)
	current, err := leader.NewTerm(ctx, db, streams.RetentionLeadership) // another replica took over
	require.NoError(t, err)

	n, err := svc.PurgeClosedBefore(leader.WithTerm(ctx, deposed), time.Now().Add(time.Hour))
	require.ErrorIs(t, err, leader.ErrDeposed)
	require.Zero(t, n)
	require.Len(t, readAll(t, svc, org, "run-1", "done", 50), 2, "the stream and its chunks are whole")

	n, err = svc.PurgeClosedBefore(leader.WithTerm(ctx, current), time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Empty(t, readAll(t, svc, org, "run-1", "done", 50))
}

package streams

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// The LISTEN connection is killed by the server; the hub reconnects and
// wakes every subscriber, so chunks committed while nobody listened are read
// all the same, and live delivery resumes.
func TestTheHubReconnectsAndNoChunkIsLost(t *testing.T) {
	db := testkit.NewPool(t)
	reg := prometheus.NewRegistry()
	svc, err := New(db, Config{Logger: testkit.Logger(t), Registry: reg})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, svc.Start(ctx))
	defer func() { require.NoError(t, svc.Stop(ctx)) }()

	tail, err := svc.Tail("org", "run", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	b, err := tail.Next(ctx)
	require.NoError(t, err)
	require.Empty(t, b.Chunks)

	old := svc.hub.backendPID()
	var killed bool
	require.NoError(t, db.QueryRow(ctx, "SELECT pg_terminate_backend($1)", old).Scan(&killed))
	require.True(t, killed)
	// Committed while the hub may be down: its notification may be lost.
	_, err = svc.Append(ctx, "org", "run", "out", [][]byte{[]byte("during")})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return reconnects(t, reg) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NotEqual(t, old, svc.hub.backendPID())
	got := drain(t, tail)
	require.Equal(t, []string{"during"}, got)

	_, err = svc.Append(ctx, "org", "run", "out", [][]byte{[]byte("after")})
	require.NoError(t, err)
	require.Equal(t, []string{"after"}, drain(t, tail), "live delivery resumes on the new connection")
}

// drain waits for a signal and reads until something arrives.
func drain(t *testing.T, tail *Tail) []string {
	t.Helper()
	for {
		select {
		case <-tail.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("no signal")
		}
		b, err := tail.Next(context.Background())
		require.NoError(t, err)
		if len(b.Chunks) > 0 {
			out := make([]string, len(b.Chunks))
			for i, c := range b.Chunks {
				out[i] = string(c.Data)
			}
			return out
		}
	}
}

// runWithoutDatabase runs h as if it listened, with no connection: for
// tests of the fan-out alone, which feed it notifications by hand.
func runWithoutDatabase(t *testing.T, h *Hub) {
	t.Helper()
	require.NoError(t, h.life.Start(context.Background(), "streams hub", func(ctx context.Context) { <-ctx.Done() }))
	t.Cleanup(func() { require.NoError(t, h.Stop(context.Background())) })
}

func TestMalformedNotificationsAreIgnored(t *testing.T) {
	m, err := newMetrics(nil)
	require.NoError(t, err)
	h := newHub(nil, testkit.Logger(t), m)
	runWithoutDatabase(t, h)
	sub, err := h.Subscribe("org", "run", "out")
	require.NoError(t, err)
	defer sub.Close()
	for _, bad := range []string{"no separators", "a3/run/out", "3/run/out/org", "x3/run/out/org", "a/run/out/org", "ax/run/out/org"} {
		h.dispatch(bad)
	}
	require.Empty(t, sub.Ready())
	h.dispatch("a3/run/out/org")
	require.Len(t, sub.Ready(), 1)
	require.True(t, sub.needsRead(0), "a new subscription reads first")
	require.True(t, sub.needsRead(3), "index 3 was announced")
	require.False(t, sub.needsRead(4))

	sub2, err := h.Subscribe("org/with/slashes", "run", "out")
	require.NoError(t, err)
	defer sub2.Close()
	h.dispatch("a5/run/out/org/with/slashes")
	require.Len(t, sub2.Ready(), 1, "an org id may hold slashes: it comes last")
	h.dispatch("c5/run/out/org")
	require.True(t, sub.needsRead(99), "a close makes the subscription read")
}

// An inbox hands over published chunks in order and without gaps, drops
// what was read, and gives way to the table when it overflows.
func TestTheInboxHandsOverPublishedChunksInOrder(t *testing.T) {
	m, err := newMetrics(nil)
	require.NoError(t, err)
	h := newHub(nil, testkit.Logger(t), m)
	runWithoutDatabase(t, h)
	sub, err := h.Subscribe("org", "run", "out")
	require.NoError(t, err)
	defer sub.Close()
	require.True(t, sub.needsRead(0))

	buf := []byte("c")
	h.publish("org", "run", "out", 3, [][]byte{[]byte("d"), []byte("e")})
	h.publish("org", "run", "out", 0, [][]byte{[]byte("a"), []byte("b"), buf})
	h.publish("org", "run", "out", 7, [][]byte{[]byte("h")})
	buf[0] = 'X' // published data is a copy
	h.publish("other", "run", "out", 5, [][]byte{[]byte("nobody listens")})

	got := sub.take(0, 4)
	require.Equal(t, []string{"a", "b", "c", "d"}, chunkData(got), "in index order, across batches, up to the limit")
	require.Equal(t, []int64{0, 1, 2, 3}, chunkIndexes(got))
	got = sub.take(4, 10)
	require.Equal(t, []string{"e"}, chunkData(got), "stops at the gap before 7")
	require.True(t, sub.pending(5), "7 was announced: the table holds 5 and 6")
	require.True(t, sub.needsRead(5))
	require.Equal(t, []string{"h"}, chunkData(sub.take(7, 10)), "after the read fills the gap")
	require.False(t, sub.needsRead(8))
	require.False(t, sub.pending(8))

	for i := range inboxMaxBatches + 1 {
		h.publish("org", "run", "out", 8+int64(i), [][]byte{[]byte("x")})
	}
	require.Empty(t, sub.take(8, 10), "an overflowing inbox is dropped")
	require.True(t, sub.needsRead(8), "and the table read instead")
}

func chunkData(cs []Chunk) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(c.Data)
	}
	return out
}

func chunkIndexes(cs []Chunk) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.Index
	}
	return out
}

func reconnects(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "reveille_streams_listen_reconnects_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// A silent LISTEN connection is pinged, and a ping that succeeds leaves it
// listening.
func TestAnIdleHubPingsItsConnectionAndKeepsListening(t *testing.T) {
	db := testkit.NewPool(t)
	svc, err := New(db, Config{Logger: testkit.Logger(t)})
	require.NoError(t, err)
	svc.hub.pingEvery = 10 * time.Millisecond
	ctx := context.Background()
	require.NoError(t, svc.Start(ctx))
	defer func() { require.NoError(t, svc.Stop(ctx)) }()
	tail, err := svc.Tail("org", "run", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	pid := svc.hub.backendPID()

	require.Eventually(t, func() bool { return svc.hub.pings.Load() >= 3 }, 10*time.Second, 5*time.Millisecond)
	_, err = svc.Append(ctx, "org", "run", "out", [][]byte{[]byte("still heard")})
	require.NoError(t, err)
	require.Equal(t, []string{"still heard"}, drain(t, tail))
	require.Equal(t, pid, svc.hub.backendPID(), "no reconnect was needed")
}

// A ping that fails makes the hub reconnect.
func TestAHubWhosePingFailsReconnects(t *testing.T) {
	db := testkit.NewPool(t)
	reg := prometheus.NewRegistry()
	svc, err := New(db, Config{Logger: testkit.Logger(t), Registry: reg})
	require.NoError(t, err)
	svc.hub.pingEvery, svc.hub.pingTimeout = 10*time.Millisecond, time.Nanosecond
	ctx := context.Background()
	require.NoError(t, svc.Start(ctx))
	defer func() { require.NoError(t, svc.Stop(ctx)) }()
	require.Eventually(t, func() bool { return reconnects(t, reg) >= 1 }, 10*time.Second, 5*time.Millisecond)
}

func TestAnAppendTooLargeForAnInboxIsReadFromTheTable(t *testing.T) {
	m, err := newMetrics(nil)
	require.NoError(t, err)
	h := newHub(nil, testkit.Logger(t), m)
	runWithoutDatabase(t, h)
	sub, err := h.Subscribe("org", "run", "out")
	require.NoError(t, err)
	defer sub.Close()
	require.True(t, sub.needsRead(0))
	h.publish("org", "run", "out", 0, [][]byte{make([]byte, inboxMaxBytes), {1}})
	require.Len(t, sub.Ready(), 1)
	require.Empty(t, sub.take(0, 10))
	require.True(t, sub.needsRead(0), "announced, to be read from the table")
	require.False(t, sub.needsRead(2))
}

// A stop whose wait for the notifications in flight runs out still stops
// the hub: live tails end, or the API's shutdown would wait on them to its
// own timeout. (The notification that never finishes is simulated.)
func TestAStopThatCannotWaitForANotificationStillEndsTheLiveTails(t *testing.T) {
	db := testkit.NewPool(t)
	svc, err := New(db, Config{Logger: testkit.Logger(t), Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, svc.Start(ctx))
	sub, err := svc.hub.Subscribe("org", "run", "out")
	require.NoError(t, err)
	defer sub.Close()
	svc.notifier.mu.Lock()
	svc.notifier.sending = make(chan struct{}) // a send that never ends
	svc.notifier.mu.Unlock()

	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = svc.Stop(sctx)

	require.ErrorIs(t, err, context.DeadlineExceeded, "the wait is reported")
	select {
	case <-sub.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hub kept running: live tails would not end")
	}
}

package streams_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

// follow reads a tail until it ends, waiting on Ready between reads, and
// returns the chunk data in order with the final tail index.
func follow(t *testing.T, tail *streams.Tail) ([]string, int64) {
	t.Helper()
	var got []string
	for {
		b, err := tail.Next(context.Background())
		require.NoError(t, err)
		got = append(got, dataOf(b.Chunks)...)
		if b.Ended {
			return got, b.TailIndex
		}
		if !b.More {
			waitReady(t, tail)
		}
	}
}

// await waits for and returns the next non-empty batch, or the end: a
// signal may be spurious (a change already read), so one wait is not one
// batch.
func await(t *testing.T, tail *streams.Tail) streams.Batch {
	t.Helper()
	for {
		waitReady(t, tail)
		b, err := tail.Next(context.Background())
		require.NoError(t, err)
		if len(b.Chunks) > 0 || b.Ended {
			return b
		}
	}
}

func TestATailAttachedBeforeTheStreamExistsSeesEveryChunkLive(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	tail, err := svc.Tail(org, "run-1", "live", 0)
	require.NoError(t, err)
	defer tail.Close()

	b, err := tail.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, streams.Batch{TailIndex: -1}, b, "nothing yet, not ended")
	for i := range 20 {
		// Each chunk is committed only after the previous one was received:
		// delivery is live, not a replay at the end.
		mustAppend(t, svc, org, "run-1", "live", fmt.Sprint(i))
		b := await(t, tail)
		require.Equal(t, []string{fmt.Sprint(i)}, dataOf(b.Chunks))
		require.EqualValues(t, i, b.Chunks[0].Index)
	}
	require.NoError(t, svc.Close(ctx, org, "run-1", "live"))
	b = await(t, tail)
	require.Empty(t, b.Chunks)
	require.True(t, b.Ended)
	require.EqualValues(t, 19, b.TailIndex)
}

func TestATailResumesFromAnIndexAndEndsWhenTheStreamCloses(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	for i := range 5 {
		mustAppend(t, svc, org, "run-1", "out", fmt.Sprint(i))
	}
	tail, err := svc.Tail(org, "run-1", "out", 3)
	require.NoError(t, err)
	defer tail.Close()
	done := make(chan []string)
	go func() {
		got, _ := follow(t, tail)
		done <- got
	}()
	mustAppend(t, svc, org, "run-1", "out", "5", "6")
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	select {
	case got := <-done:
		require.Equal(t, []string{"3", "4", "5", "6"}, got, "each chunk from the start index exactly once")
	case <-time.After(testWait):
		t.Fatal("the tail did not end")
	}
}

func TestATailOfAClosedEmptyStreamEndsAtOnce(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	require.NoError(t, svc.Close(context.Background(), org, "run-1", "empty"))
	tail, err := svc.Tail(org, "run-1", "empty", 0)
	require.NoError(t, err)
	defer tail.Close()
	b, err := tail.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, streams.Batch{Ended: true, TailIndex: -1}, b)
}

func TestATailReadsLongBacklogsInBoundedBatches(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	// A reader that follows the writes to the end: once it saw the close,
	// every notification of this stream has been handled, and a tail opened
	// afterwards has only the table to go by.
	probe, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer probe.Close()
	chunks := make([][]byte, 1000)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "%d", i)
	}
	_, err = svc.Append(context.Background(), org, "run-1", "out", chunks)
	require.NoError(t, err)
	require.NoError(t, svc.Close(context.Background(), org, "run-1", "out"))
	follow(t, probe)

	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	var got []string
	for pages := 0; ; pages++ {
		b, err := tail.Next(context.Background())
		require.NoError(t, err)
		require.True(t, len(b.Chunks) > 0 || b.Ended, "a stored backlog is read page after page without waiting (page %d)", pages)
		require.Less(t, len(b.Chunks), 1000, "bounded")
		got = append(got, dataOf(b.Chunks)...)
		if b.Ended {
			require.EqualValues(t, 999, b.TailIndex)
			break
		}
		require.True(t, b.More, "the rest is stored already")
	}
	require.Len(t, got, 1000)
	for i, d := range got {
		require.Equal(t, fmt.Sprint(i), d)
	}
}

func TestASlowSubscriberBlocksNeitherWritersNorOtherReaders(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, _ := newService(t, streams.Config{Registry: reg})
	ctx := context.Background()
	// A subscriber that is never drained, on the same stream.
	stuck, err := svc.Hub().Subscribe(org, "run-1", "out")
	require.NoError(t, err)
	defer stuck.Close()
	reader, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer reader.Close()
	done := make(chan []string)
	go func() {
		got, _ := follow(t, reader)
		done <- got
	}()

	const n = 300
	for i := range n {
		mustAppend(t, svc, org, "run-1", "out", fmt.Sprint(i))
	}
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	select {
	case got := <-done:
		require.Len(t, got, n)
		for i, d := range got {
			require.Equal(t, fmt.Sprint(i), d)
		}
	case <-time.After(testWait):
		t.Fatal("the live reader did not finish")
	}
	require.Len(t, stuck.Ready(), 1, "the stuck subscriber's signals coalesced into one")
	require.Equal(t, 2.0, metricValue(t, reg, "reveille_streams_live_subscribers"))
}

func TestSignalsReachOnlyTheSubscribersOfTheirStream(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	mine, err := svc.Hub().Subscribe(org, "run-1", "out")
	require.NoError(t, err)
	defer mine.Close()
	theirs, err := svc.Hub().Subscribe(otherOrg, "run-1", "out")
	require.NoError(t, err)
	defer theirs.Close()
	sibling, err := svc.Hub().Subscribe(org, "run-1", "other")
	require.NoError(t, err)
	defer sibling.Close()

	mustAppend(t, svc, org, "run-1", "out", "x")
	// The notification of a later append to "other" orders the check: once
	// the sibling is signalled, the first notification was dispatched too.
	mustAppend(t, svc, org, "run-1", "other", "y")
	select {
	case <-sibling.Ready():
	case <-time.After(testWait):
		t.Fatal("no signal")
	}
	require.Len(t, mine.Ready(), 1)
	require.Empty(t, theirs.Ready(), "another org's subscriber is not woken")
}

func TestStoppingTheHubEndsSubscriptionsAndRefusesNewOnes(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	require.NoError(t, svc.Stop(context.Background()))
	select {
	case <-tail.Done():
	case <-time.After(testWait):
		t.Fatal("the tail was not ended")
	}
	_, err = svc.Tail(org, "run-1", "out", 0)
	require.ErrorIs(t, err, streams.ErrStopped)
	require.NoError(t, svc.Hub().Stop(context.Background()), "stopping twice is safe")
}

func TestSubscribingBeforeStartIsRefused(t *testing.T) {
	svc, err := streams.New(testkit.NewPool(t), streams.Config{})
	require.NoError(t, err)
	_, err = svc.Tail(org, "run-1", "out", 0)
	require.ErrorIs(t, err, streams.ErrStopped)
}

// Two services on one database stand for two replicas: a tail learns of
// the other's appends from notifications and reads them from the table,
// and of its own from its inbox; interleaved, every chunk arrives once, in
// order.
func TestATailFollowsWritersOnEveryReplicaExactlyOnceInOrder(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	other, err := streams.New(db, streams.Config{Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, other.Start(context.Background()))
	defer func() { require.NoError(t, other.Stop(context.Background())) }()

	tail, err := svc.Tail(org, "run-1", "mixed", 0)
	require.NoError(t, err)
	defer tail.Close()
	type result struct {
		chunks []streams.Chunk
		last   int64
	}
	done := make(chan result, 1)
	go func() {
		var all []streams.Chunk
		for {
			b, err := tail.Next(context.Background())
			if err != nil {
				t.Error(err)
				done <- result{}
				return
			}
			all = append(all, b.Chunks...)
			if b.Ended {
				done <- result{all, b.TailIndex}
				return
			}
			if !b.More {
				select {
				case <-tail.Ready():
				case <-time.After(testWait):
					t.Error("the tail was not woken")
					done <- result{}
					return
				}
			}
		}
	}()

	const perWriter = 60
	var wg sync.WaitGroup
	for w := range 6 {
		replica := []*streams.Service{svc, other}[w%2]
		wg.Go(func() {
			for i := range perWriter {
				batch := [][]byte{fmt.Appendf(nil, "%d-%d", w, i)}
				if i%3 == 0 {
					batch = append(batch, fmt.Appendf(nil, "%d-%d+", w, i))
				}
				if _, err := replica.Append(context.Background(), org, "run-1", "mixed", batch); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, other.Close(context.Background(), org, "run-1", "mixed"))

	var got result
	select {
	case got = <-done:
	case <-time.After(testWait):
		t.Fatal("the tail did not end")
	}
	stored := readAll(t, svc, org, "run-1", "mixed", 500)
	require.Len(t, got.chunks, len(stored))
	for i, c := range got.chunks {
		require.EqualValues(t, i, c.Index, "each index once, in order")
		require.Equal(t, string(stored[i].Data), string(c.Data))
	}
	require.EqualValues(t, len(stored)-1, got.last)
}

// Services started and stopped in a loop, each with a live tail and an
// append in flight, stop promptly and leave nothing subscribed.
func TestStartingAndStoppingRepeatedlyLeavesNothingBehind(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	for i := range 5 {
		reg := prometheus.NewRegistry()
		svc, err := streams.New(db, streams.Config{Logger: testkit.Logger(t), Registry: reg, LeaderRetry: 10 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, svc.Start(ctx))
		tail, err := svc.Tail(org, "run-1", "out", 0)
		require.NoError(t, err)
		_, err = svc.Append(ctx, org, "run-1", "out", [][]byte{fmt.Appendf(nil, "%d", i)})
		require.NoError(t, err)
		require.NotEmpty(t, await(t, tail).Chunks)
		sctx, cancel := context.WithTimeout(ctx, testWait)
		require.NoError(t, svc.Stop(sctx))
		cancel()
		<-tail.Done()
		tail.Close()
		require.Equal(t, 0.0, metricValue(t, reg, "reveille_streams_live_subscribers"))
	}
}

// A chunk committed without a notification (its writer died before the
// NOTIFY) is not seen by a tail waiting for one, but is by its next Recheck.
func TestATailThatMissedANotificationCatchesUpOnRecheck(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	mustAppend(t, svc, org, "run-1", "out", "c0")
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	first, err := tail.Next(context.Background()) // a new tail reads the table
	require.NoError(t, err)
	require.Equal(t, []string{"c0"}, dataOf(first.Chunks))
	_, err = db.Exec(context.Background(), `
		WITH st AS (
		  UPDATE streams SET chunk_count = chunk_count + 1, byte_count = byte_count + 2
		  WHERE org_id = $1 AND run_id = 'run-1' AND name = 'out'
		  RETURNING id, chunk_count - 1 AS idx, byte_count - 2 AS start)
		INSERT INTO stream_chunks (stream_id, chunk_index, org_id, byte_start, data)
		SELECT id, idx, $1, start, 'c1'::bytea FROM st`, org)
	require.NoError(t, err)
	b, err := tail.Next(context.Background())
	require.NoError(t, err)
	require.Empty(t, b.Chunks, "nothing announced it")

	tail.Recheck()

	require.Equal(t, []string{"c1"}, dataOf(await(t, tail).Chunks))
}

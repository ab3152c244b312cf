package streams_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

// newTracedService is newService on a pool whose round trips rt notes.
func newTracedService(t *testing.T, rt *testkit.RoundTrips) (*streams.Service, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rt
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	// The background loop keeps ten years: only the test purges.
	svc, err := streams.New(db, streams.Config{Logger: testkit.Logger(t), Registry: prometheus.NewRegistry(), Retention: 10 * 365 * 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, svc.Stop(context.Background())) })
	return svc, db
}

// driveFor runs a tail as the SSE handler does (Next again at once while
// More, else wait for Ready) for d or until it ends, and returns the last
// batch and how many times it read the table.
func driveFor(t *testing.T, rt *testkit.RoundTrips, tail *streams.Tail, d time.Duration) (streams.Batch, int) {
	t.Helper()
	rt.Take()
	deadline := time.After(d)
	var b streams.Batch
	var err error
loop:
	for {
		b, err = tail.Next(context.Background())
		require.NoError(t, err)
		if b.Ended {
			break
		}
		if b.More {
			select {
			case <-deadline:
				break loop
			default:
			}
			continue
		}
		select {
		case <-tail.Ready():
		case <-deadline:
			break loop
		}
	}
	reads := 0
	for _, s := range rt.Take() {
		if strings.HasPrefix(s, "SELECT s.chunk_count, s.done") {
			reads++
		}
	}
	return b, reads
}

func appendClosed(t *testing.T, svc *streams.Service, name string, n int) {
	t.Helper()
	chunks := make([][]byte, n)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "%d", i)
	}
	_, err := svc.Append(context.Background(), org, "run-1", name, chunks)
	require.NoError(t, err)
	require.NoError(t, svc.Close(context.Background(), org, "run-1", name))
}

func purgeAll(t *testing.T, svc *streams.Service, db *pgxpool.Pool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE streams SET closed_at = now() - interval '8 days'`)
	require.NoError(t, err)
	n, err := svc.PurgeClosedBefore(context.Background(), time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A tail that read the first page of a closed stream's backlog (256 of 300
// chunks), whose stream retention then purged, must not query the table
// in a loop: it has nothing to read and nothing will come.
func TestATailWhoseStreamIsPurgedUnderItDoesNotSpin(t *testing.T) {
	rt := &testkit.RoundTrips{}
	svc, db := newTracedService(t, rt)
	appendClosed(t, svc, "out", 300)
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	first, err := tail.Next(context.Background())
	require.NoError(t, err)
	require.Len(t, first.Chunks, 256)
	require.True(t, first.More)

	purgeAll(t, svc, db)

	_, reads := driveFor(t, rt, tail, 300*time.Millisecond)
	require.LessOrEqual(t, reads, 3, "reads of the table in 300 ms by a tail of a purged stream")
}

// Between retention's statements a closed stream's row is still there
// while its chunks are already gone (purged in batches, each committed on
// its own, the row last). A tail meeting that state must not spin either,
// while it lasts nor once the row is gone.
func TestATailOfAStreamBeingPurgedDoesNotSpin(t *testing.T) {
	rt := &testkit.RoundTrips{}
	svc, db := newTracedService(t, rt)
	appendClosed(t, svc, "out", 300)
	// The state after purgeChunksSQL committed, before purgeStreamsSQL.
	_, err := db.Exec(context.Background(), `DELETE FROM stream_chunks`)
	require.NoError(t, err)

	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	_, reads := driveFor(t, rt, tail, 300*time.Millisecond)
	require.LessOrEqual(t, reads, 3, "reads in 300 ms while the stream's chunks are purged and its row is not")

	purgeAll(t, svc, db)
	_, reads = driveFor(t, rt, tail, 300*time.Millisecond)
	require.LessOrEqual(t, reads, 3, "reads in 300 ms once the row is gone too")
}

// A tail whose closed stream is purged before it read every chunk ends,
// and says where the stream ended, so that its reader can tell it missed
// chunks (the client library's ErrStreamGap) instead of waiting forever
// for chunks that no longer exist.
func TestATailWhoseStreamIsPurgedEndsAndTellsItsTailIndex(t *testing.T) {
	rt := &testkit.RoundTrips{}
	svc, db := newTracedService(t, rt)
	appendClosed(t, svc, "out", 300)
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	first, err := tail.Next(context.Background())
	require.NoError(t, err)
	require.Len(t, first.Chunks, 256)

	purgeAll(t, svc, db)

	tail.Recheck() // as the SSE handler does at each keep-alive
	b, _ := driveFor(t, rt, tail, time.Second)
	require.True(t, b.Ended, "the tail ends")
	require.Empty(t, b.Chunks)
	require.EqualValues(t, 299, b.TailIndex, "past the last chunk read (255): the reader learns it missed some")
}

// Same, for a tail that meets the state between retention's statements
// (the row there, the chunks gone): it ends at once, at the row's tail.
func TestATailOfAStreamBeingPurgedEndsAndTellsItsTailIndex(t *testing.T) {
	rt := &testkit.RoundTrips{}
	svc, db := newTracedService(t, rt)
	appendClosed(t, svc, "out", 300)
	_, err := db.Exec(context.Background(), `DELETE FROM stream_chunks`)
	require.NoError(t, err)
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	b, err := tail.Next(context.Background())
	require.NoError(t, err)
	require.True(t, b.Ended, "the tail ends")
	require.Empty(t, b.Chunks)
	require.EqualValues(t, 299, b.TailIndex)
}

// Retention deletes a closed stream's chunks in batches of ctids, in the
// order a scan yields them (heap order), each batch committed on its own.
// Once a vacuum let later chunks fill the space of purged ones, that order
// is not the chunks': a read between two batches finds holes. A tail never
// skips over one.
func TestATailNeverSkipsAHoleLeftByAPurgeInProgress(t *testing.T) {
	svc, db := newService(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour})
	ctx := context.Background()
	for i := range 50 {
		mustAppend(t, svc, org, "run-1", "x", fmt.Sprint(i))
		mustAppend(t, svc, org, "run-1", "y", fmt.Sprint(i))
	}
	require.NoError(t, svc.Close(ctx, org, "run-1", "y"))
	_, err := db.Exec(ctx, `UPDATE streams SET closed_at = now() - interval '8 days' WHERE name = 'y'`)
	require.NoError(t, err)
	_, err = svc.PurgeClosedBefore(ctx, time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	_, err = db.Exec(ctx, `VACUUM stream_chunks`)
	require.NoError(t, err)
	for i := 50; i < 100; i++ { // into y's space, among x's first chunks
		mustAppend(t, svc, org, "run-1", "x", fmt.Sprint(i))
	}
	require.NoError(t, svc.Close(ctx, org, "run-1", "x"))
	// Retention's first statement on x with a batch of 20 (purgeChunksSQL).
	tag, err := db.Exec(ctx, `
		DELETE FROM stream_chunks WHERE ctid = ANY (ARRAY(
		    SELECT ctid FROM stream_chunks WHERE stream_id = ANY ($1) LIMIT $2))`,
		[]any{mustStreamID(t, db, "x")}, 20)
	require.NoError(t, err)
	require.EqualValues(t, 20, tag.RowsAffected())

	tail, err := svc.Tail(org, "run-1", "x", 40)
	require.NoError(t, err)
	defer tail.Close()
	next := int64(40)
	for range 10 {
		b, err := tail.Next(ctx)
		require.NoError(t, err)
		for _, c := range b.Chunks {
			require.Equal(t, next, c.Index, "chunks in order without a gap")
			next++
		}
		if b.Ended || !b.More {
			break
		}
	}
}

func mustStreamID(t *testing.T, db *pgxpool.Pool, name string) (id [16]byte) {
	t.Helper()
	require.NoError(t, db.QueryRow(context.Background(), `SELECT id FROM streams WHERE name = $1`, name).Scan(&id))
	return id
}

// Chunks before a tail's position purged (retention's first batches) take
// nothing from it: it reads the rest and ends as usual.
func TestATailAheadOfAPurgeReadsTheRestAndEnds(t *testing.T) {
	svc, db := newService(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour})
	appendClosed(t, svc, "out", 10)
	_, err := db.Exec(context.Background(), `DELETE FROM stream_chunks WHERE chunk_index < 5`)
	require.NoError(t, err)
	tail, err := svc.Tail(org, "run-1", "out", 5)
	require.NoError(t, err)
	defer tail.Close()
	got, last := follow(t, tail)
	require.Equal(t, []string{"5", "6", "7", "8", "9"}, got)
	require.EqualValues(t, 9, last)
}

// A tail still behind when its closed stream is purged must end (README:
// "ends at once with event: end and a tail_index past its last id"), even
// when a new stream of the same name was written meanwhile: it must not go
// on with the new stream's chunks as if they were the purged one's.
func TestATailBehindAPurgedStreamDoesNotContinueIntoANewStreamOfTheSameName(t *testing.T) {
	rt := &testkit.RoundTrips{}
	svc, db := newTracedService(t, rt)
	ctx := context.Background()
	appendClosed(t, svc, "out", 300) // "0".."299"
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()
	first, err := tail.Next(ctx)
	require.NoError(t, err)
	require.Len(t, first.Chunks, 256)
	require.True(t, first.More)

	purgeAll(t, svc, db)
	// The run reuses the name: a new stream, new content.
	chunks := make([][]byte, 300)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "new-%d", i)
	}
	_, err = svc.Append(ctx, org, "run-1", "out", chunks)
	require.NoError(t, err)

	b, err := tail.Next(ctx)
	require.NoError(t, err)
	for _, c := range b.Chunks {
		require.NotContains(t, string(c.Data), "new-", "chunk %d of the new stream handed to a tail of the purged one", c.Index)
	}
	require.True(t, b.Ended, "the tail of the purged stream ends")
}

// A tail that has every chunk of its stream ends once the stream is
// closed — also when retention purged the closed stream before the tail
// read again (it must not wait for ever on a stream that is gone), and when
// a new, longer stream of the same name was written after the purge: it
// ends at its own stream's last index. At the new stream's, it would tell
// its reader (README: "a tail_index past its last id"; the client's
// ErrStreamGap) that it missed chunks of a stream it had whole.
func TestACaughtUpTailWhoseClosedStreamIsPurgedEndsAtItsOwnTail(t *testing.T) {
	for _, written := range []bool{false, true} {
		t.Run(map[bool]string{false: "gone", true: "written again"}[written], func(t *testing.T) {
			rt := &testkit.RoundTrips{}
			svc, db := newTracedService(t, rt)
			ctx := context.Background()
			_, err := svc.Append(ctx, org, "run-1", "out", [][]byte{[]byte("a"), []byte("b")})
			require.NoError(t, err)
			tail, err := svc.Tail(org, "run-1", "out", 0)
			require.NoError(t, err)
			defer tail.Close()
			b, err := tail.Next(ctx)
			require.NoError(t, err)
			require.Len(t, b.Chunks, 2)
			require.False(t, b.Ended)

			require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
			purgeAll(t, svc, db) // before the tail got round to reading the close
			if written {
				_, err = svc.Append(ctx, org, "run-1", "out", [][]byte{[]byte("n0"), []byte("n1"), []byte("n2"), []byte("n3"), []byte("n4")})
				require.NoError(t, err)
			}

			b, _ = driveFor(t, rt, tail, 30*time.Second) // (ends at its first read)
			require.True(t, b.Ended, "the tail of a closed, purged stream ends")
			require.Empty(t, b.Chunks)
			require.Equal(t, int64(1), b.TailIndex, "it had every chunk of its stream")
		})
	}
}

package streams_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/startstop"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	org      = "org-a"
	otherOrg = "org-b"
	testWait = 10 * time.Second
	pollTick = 5 * time.Millisecond
)

// newService returns a started service on a fresh database.
func newService(t *testing.T, cfg streams.Config) (*streams.Service, *pgxpool.Pool) {
	t.Helper()
	db := testkit.NewPool(t)
	if cfg.Logger == nil {
		cfg.Logger = testkit.Logger(t)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	svc, err := streams.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, svc.Stop(context.Background())) })
	return svc, db
}

// readAll pages through the whole stream with the given limit.
func readAll(t *testing.T, svc *streams.Service, org, run, name string, limit int) []streams.Chunk {
	t.Helper()
	var all []streams.Chunk
	next := int64(0)
	for {
		p, err := svc.Chunks(context.Background(), org, run, name, next, limit)
		require.NoError(t, err)
		all = append(all, p.Items...)
		next = p.Next
		if !p.HasMore {
			return all
		}
	}
}

func TestConcurrentWritersGetGapFreeIndexesAndKeepTheirContent(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	const writers, perWriter = 16, 500
	got := make([][]streams.Range, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				r, err := svc.Append(context.Background(), org, "run-1", "tokens", [][]byte{fmt.Appendf(nil, "w%02d-%04d", w, i)})
				if err != nil {
					errs <- err
					return
				}
				got[w] = append(got[w], r)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	all := readAll(t, svc, org, "run-1", "tokens", 500)
	require.Len(t, all, writers*perWriter)
	for i, c := range all {
		require.EqualValues(t, i, c.Index, "indexes are exactly 0…7999")
	}
	for w := range writers {
		require.Len(t, got[w], perWriter)
		for i, r := range got[w] {
			require.Equal(t, r.FirstIndex, r.LastIndex)
			require.Equal(t, fmt.Sprintf("w%02d-%04d", w, i), string(all[r.FirstIndex].Data), "the chunk at the index returned is the one written")
			if i > 0 {
				require.Greater(t, r.FirstIndex, got[w][i-1].FirstIndex, "one writer's chunks keep their order")
			}
		}
	}
	info, err := svc.Info(context.Background(), org, "run-1", "tokens")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: writers*perWriter - 1}, info)
}

func TestConcurrentBatchesGetConsecutiveIndexesEach(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	const writers, batches, size = 8, 40, 10
	var mu sync.Mutex
	ranges := map[string]streams.Range{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for b := range batches {
				batch := make([][]byte, size)
				for i := range batch {
					batch[i] = fmt.Appendf(nil, "%d/%d/%d", w, b, i)
				}
				r, err := svc.Append(context.Background(), org, "run-1", "log", batch)
				if !(assertNoError(t, err)) {
					return
				}
				mu.Lock()
				ranges[fmt.Sprintf("%d/%d", w, b)] = r
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	all := readAll(t, svc, org, "run-1", "log", 500)
	require.Len(t, all, writers*batches*size)
	for key, r := range ranges {
		require.EqualValues(t, size-1, r.LastIndex-r.FirstIndex)
		for i := range size {
			require.Equal(t, fmt.Sprintf("%s/%d", key, i), string(all[r.FirstIndex+int64(i)].Data), "a batch is stored contiguously, in order")
		}
	}
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

func TestAppendCreatesTheStreamOnFirstUse(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	info, err := svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: -1, Done: false}, info, "an absent stream")

	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 2}, mustAppend(t, svc, org, "run-1", "out", "a", "b", "c"))
	require.Equal(t, streams.Range{FirstIndex: 3, LastIndex: 3}, mustAppend(t, svc, org, "run-1", "out", "d"))
	info, err = svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: 3, Done: false}, info)
}

// A nil chunk is an empty one, keyed or not: pgx sends a nil []byte as
// NULL, which refused the whole append.
func TestANilChunkIsAnEmptyChunk(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	chunks := [][]byte{[]byte("a"), nil, []byte("b")}
	r, err := svc.Append(ctx, org, "run-1", "out", chunks)
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 2}, r)
	require.Nil(t, chunks[1], "the caller's chunks are left as they were")
	r, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k", [][]byte{nil})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 3, LastIndex: 3}, r)
	got := readAll(t, svc, org, "run-1", "out", 10)
	require.Len(t, got, 4)
	for _, i := range []int{1, 3} {
		require.Empty(t, got[i].Data)
	}
	require.Equal(t, "b", string(got[2].Data))
}

func mustAppend(t *testing.T, svc *streams.Service, org, run, name string, data ...string) streams.Range {
	t.Helper()
	chunks := make([][]byte, len(data))
	for i, d := range data {
		chunks[i] = []byte(d)
	}
	r, err := svc.Append(context.Background(), org, run, name, chunks)
	require.NoError(t, err)
	return r
}

func TestAppendingToAClosedStreamIsAConflictAndStoresNothing(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	mustAppend(t, svc, org, "run-1", "out", "a")
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))

	_, err := svc.Append(ctx, org, "run-1", "out", [][]byte{[]byte("late"), []byte("later")})
	require.ErrorIs(t, err, streams.ErrClosed)
	require.ErrorIs(t, err, apperr.ErrConflict)

	info, err := svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: 0, Done: true}, info)
	require.Len(t, readAll(t, svc, org, "run-1", "out", 10), 1)
}

func TestClosingTwiceChangesNothing(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	ctx := context.Background()
	mustAppend(t, svc, org, "run-1", "out", "a", "b")
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	closedAt := func() time.Time {
		var at time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT closed_at FROM streams WHERE org_id = $1`, org).Scan(&at))
		return at
	}
	first := closedAt()
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	require.Equal(t, first, closedAt(), "retention counts from the first close")
	info, err := svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: 1, Done: true}, info)
}

func TestClosingAnAbsentStreamCreatesItEmptyAndClosed(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	require.NoError(t, svc.Close(ctx, org, "run-1", "never-written"))
	info, err := svc.Info(ctx, org, "run-1", "never-written")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: -1, Done: true}, info)
	names, err := svc.ListNames(ctx, org, "run-1", "", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"never-written"}, names.Names)
	_, err = svc.Append(ctx, org, "run-1", "never-written", [][]byte{[]byte("x")})
	require.ErrorIs(t, err, streams.ErrClosed)
}

func TestARolledBackAppendLeavesNoGap(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	ctx := context.Background()
	mustAppend(t, svc, org, "run-1", "out", "a")

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	r, err := svc.AppendTx(ctx, tx, org, "run-1", "out", [][]byte{[]byte("ghost")})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 1, LastIndex: 1}, r)
	require.NoError(t, tx.Rollback(ctx))

	require.Equal(t, streams.Range{FirstIndex: 1, LastIndex: 1}, mustAppend(t, svc, org, "run-1", "out", "b"))
	all := readAll(t, svc, org, "run-1", "out", 10)
	require.Equal(t, []string{"a", "b"}, dataOf(all))
}

func TestAnAppendInACallersTransactionIsSeenOnlyOnCommit(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	ctx := context.Background()
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)
	defer tail.Close()

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = svc.AppendTx(ctx, tx, org, "run-1", "out", [][]byte{[]byte("in-tx")})
	require.NoError(t, err)
	b, err := tail.Next(ctx)
	require.NoError(t, err)
	require.Empty(t, b.Chunks, "uncommitted chunks are invisible")

	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"in-tx"}, dataOf(await(t, tail).Chunks))
}

func dataOf(chunks []streams.Chunk) []string {
	out := make([]string, len(chunks))
	for i, c := range chunks {
		out[i] = string(c.Data)
	}
	return out
}

func waitReady(t *testing.T, tail *streams.Tail) {
	t.Helper()
	select {
	case <-tail.Ready():
	case <-time.After(testWait):
		t.Fatal("the tail was not woken")
	}
}

func TestAnotherOrgsStreamLooksAbsent(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	mustAppend(t, svc, otherOrg, "run-1", "out", "secret-1", "secret-2")
	require.NoError(t, svc.Close(ctx, otherOrg, "run-1", "out"))

	info, err := svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: -1, Done: false}, info)
	names, err := svc.ListNames(ctx, org, "run-1", "", 10)
	require.NoError(t, err)
	require.Empty(t, names.Names)
	page, err := svc.Chunks(ctx, org, "run-1", "out", 0, 10)
	require.NoError(t, err)
	require.Equal(t, streams.Page{Next: 0, Info: streams.Info{TailIndex: -1}}, page)

	// Writing and closing are this org's own: no 409 from the other's close.
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 0}, mustAppend(t, svc, org, "run-1", "out", "mine"))
	require.Equal(t, []string{"mine"}, dataOf(readAll(t, svc, org, "run-1", "out", 10)))
	require.Equal(t, []string{"secret-1", "secret-2"}, dataOf(readAll(t, svc, otherOrg, "run-1", "out", 10)))
}

func TestBinaryChunksRoundTrip(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	chunks := [][]byte{{0x00, 0xff, 0xfe, 0x80, 'a', 0x00}, {}, {0xc3, 0x28}, []byte("plain")}
	_, err := svc.Append(context.Background(), org, "run-1", "bin", chunks)
	require.NoError(t, err)
	all := readAll(t, svc, org, "run-1", "bin", 10)
	require.Len(t, all, len(chunks))
	for i, c := range all {
		require.Equal(t, chunks[i], c.Data, "chunk %d", i)
	}
}

func TestPagingCoversEveryChunkOnceWithCorrectEdges(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 11, 30} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			svc, _ := newService(t, streams.Config{})
			ctx := context.Background()
			if n > 0 {
				chunks := make([][]byte, n)
				for i := range chunks {
					chunks[i] = fmt.Appendf(nil, "c%d", i)
				}
				_, err := svc.Append(ctx, org, "run-1", "out", chunks)
				require.NoError(t, err)
			}
			var seen []int64
			next := int64(0)
			for pages := 0; ; pages++ {
				require.Less(t, pages, 10, "paging ends")
				p, err := svc.Chunks(ctx, org, "run-1", "out", next, 10)
				require.NoError(t, err)
				for _, c := range p.Items {
					require.Equal(t, fmt.Sprintf("c%d", c.Index), string(c.Data))
					seen = append(seen, c.Index)
				}
				require.Equal(t, next+int64(len(p.Items)), p.Next, "next is one past the page")
				require.Equal(t, p.Next < int64(n), p.HasMore)
				next = p.Next
				if !p.HasMore {
					break
				}
				require.Len(t, p.Items, 10, "only the last page is short")
			}
			require.EqualValues(t, n, next, "at the end the cursor is the next index to be written")
			require.Len(t, seen, n)
			for i, idx := range seen {
				require.EqualValues(t, i, idx)
			}
			// A poller holding the final cursor sees nothing, then the next chunk.
			p, err := svc.Chunks(ctx, org, "run-1", "out", next, 10)
			require.NoError(t, err)
			require.Empty(t, p.Items)
			require.False(t, p.HasMore)
			require.Equal(t, next, p.Next)
			mustAppend(t, svc, org, "run-1", "out", "after")
			p, err = svc.Chunks(ctx, org, "run-1", "out", next, 10)
			require.NoError(t, err)
			require.Equal(t, []string{"after"}, dataOf(p.Items))
		})
	}
}

func TestPagesFromAStartIndexBeyondTheTailAreEmpty(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	mustAppend(t, svc, org, "run-1", "out", "a", "b")
	p, err := svc.Chunks(context.Background(), org, "run-1", "out", 7, 10)
	require.NoError(t, err)
	require.Equal(t, streams.Page{Next: 7, Info: streams.Info{TailIndex: 1}}, p)
}

func TestPagesAreBoundedInBytes(t *testing.T) {
	svc, _ := newService(t, streams.Config{MaxChunk: 300, MaxRequest: 1000})
	chunk := strings.Repeat("x", 300)
	mustAppend(t, svc, org, "run-1", "big", chunk, chunk, chunk)
	mustAppend(t, svc, org, "run-1", "big", chunk, chunk)
	p, err := svc.Chunks(context.Background(), org, "run-1", "big", 0, 500)
	require.NoError(t, err)
	require.Len(t, p.Items, 3, "three chunks fit in 1000 bytes, four do not")
	require.True(t, p.HasMore)
	require.EqualValues(t, 3, p.Next)
	require.Len(t, readAll(t, svc, org, "run-1", "big", 500), 5)
}

func TestListNamesPagesInByteOrder(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	for _, name := range []string{"d", "b", "a", "c", "B"} {
		mustAppend(t, svc, org, "run-1", name, "x")
	}
	mustAppend(t, svc, org, "run-2", "other-run", "x")
	mustAppend(t, svc, otherOrg, "run-1", "other-org", "x")

	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		p, err := svc.ListNames(ctx, org, "run-1", cursor, 2)
		require.NoError(t, err)
		got = append(got, p.Names...)
		if p.NextCursor == "" {
			break
		}
		require.Len(t, p.Names, 2)
		cursor = p.NextCursor
	}
	require.Equal(t, []string{"B", "a", "b", "c", "d"}, got)

	p, err := svc.ListNames(ctx, org, "run-1", "", 5)
	require.NoError(t, err)
	require.Len(t, p.Names, 5)
	require.Empty(t, p.NextCursor, "an exact multiple of the limit ends without a cursor")

	p, err = svc.ListNames(ctx, org, "no-such-run", "", 5)
	require.NoError(t, err)
	require.Empty(t, p.Names)
	require.Empty(t, p.NextCursor)
}

func TestInvalidRunIDsAndNamesAreRefusedNamingTheField(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	cases := map[string]string{
		"empty":          "",
		"too long":       strings.Repeat("x", 201),
		"slash":          "a/b",
		"dot":            ".",
		"dot dot":        "..",
		"control":        "a\x01b",
		"newline":        "a\nb",
		"invalid utf-8":  "a\xffb",
		"non-printable":  "a\u200bb", // zero-width space
		"unicode spaces": "a\u2028b",
	}
	for label, bad := range cases {
		t.Run(label, func(t *testing.T) {
			requireInvalid(t, "run_id", ignoreRange(svc.Append(ctx, org, bad, "out", [][]byte{{1}})))
			requireInvalid(t, "name", ignoreRange(svc.Append(ctx, org, "run-1", bad, [][]byte{{1}})))
			requireInvalid(t, "name", svc.Close(ctx, org, "run-1", bad))
			_, err := svc.Info(ctx, org, bad, "out")
			requireInvalid(t, "run_id", err)
			_, err = svc.Chunks(ctx, org, "run-1", bad, 0, 10)
			requireInvalid(t, "name", err)
			_, err = svc.ListNames(ctx, org, bad, "", 10)
			requireInvalid(t, "run_id", err)
			_, err = svc.Tail(org, "run-1", bad, 0)
			requireInvalid(t, "name", err)
		})
	}
	// The longest valid id: 200 characters, multi-byte ones included.
	long := strings.Repeat("é", 200)
	mustAppend(t, svc, org, long, "with space and ünïcode", "ok")
	mustAppend(t, svc, org, "...", ".hidden", "ok") // (only "." and ".." are path segments)
	names, err := svc.ListNames(ctx, org, long, "", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"with space and ünïcode"}, names.Names)
}

func ignoreRange(_ streams.Range, err error) error { return err }

func requireInvalid(t *testing.T, field string, err error) {
	t.Helper()
	var invalid *apperr.InvalidError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, field, invalid.Fields[0].Field)
}

func TestBadPagingArgumentsAreRefused(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	_, err := svc.Chunks(ctx, org, "run-1", "out", -1, 10)
	requireInvalid(t, "start_index", err)
	_, err = svc.Chunks(ctx, org, "run-1", "out", 0, 0)
	requireInvalid(t, "limit", err)
	_, err = svc.ListNames(ctx, org, "run-1", "", 0)
	requireInvalid(t, "limit", err)
	_, err = svc.Tail(org, "run-1", "out", -1)
	requireInvalid(t, "start_index", err)
	_, err = svc.Chunks(ctx, org, "run-1", "out", math.MaxInt64, 10)
	requireInvalid(t, "start_index", err)
	_, err = svc.Tail(org, "run-1", "out", streams.MaxIndex+2)
	requireInvalid(t, "start_index", err)
	tail, err := svc.Tail(org, "run-1", "out", streams.MaxIndex+1)
	require.NoError(t, err, "after the last chunk a stream can hold: where a reader that saw it resumes")
	tail.Close()
	_, err = svc.Chunks(ctx, org, "run-1", "out", streams.MaxIndex, 500)
	require.NoError(t, err, "the largest index is a valid (empty) read")
}

func TestOversizeChunksAndAppendsAreRefusedWhole(t *testing.T) {
	svc, _ := newService(t, streams.Config{MaxChunk: 10, MaxRequest: 25})
	ctx := context.Background()
	_, err := svc.Append(ctx, org, "run-1", "out", [][]byte{[]byte("ok"), make([]byte, 11)})
	var tooLarge *streams.TooLargeError
	require.ErrorAs(t, err, &tooLarge)
	require.Equal(t, "chunks[1]", tooLarge.What)
	require.EqualValues(t, 10, tooLarge.Limit)

	_, err = svc.Append(ctx, org, "run-1", "out", [][]byte{make([]byte, 10), make([]byte, 10), make([]byte, 10)})
	require.ErrorAs(t, err, &tooLarge)
	require.Equal(t, "chunks", tooLarge.What)
	require.EqualValues(t, 25, tooLarge.Limit)

	info, err := svc.Info(ctx, org, "run-1", "out")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: -1}, info, "nothing was written")
}

func TestAnAppendOfMoreChunksThanTheLimitIsRefusedWhole(t *testing.T) {
	svc, _ := newService(t, streams.Config{MaxChunksPerRequest: 3})
	ctx := context.Background()
	chunks := func(n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = []byte{byte(i)}
		}
		return out
	}
	r, err := svc.Append(ctx, org, "run-1", "at", chunks(3))
	require.NoError(t, err, "exactly the limit is fine")
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 2}, r)

	for name, append := range map[string]func() error{
		"plain": func() error { _, err := svc.Append(ctx, org, "run-1", "over", chunks(4)); return err },
		"keyed": func() error {
			_, err := svc.AppendWithKey(ctx, org, "run-1", "over", "key-1", chunks(4))
			return err
		},
	} {
		var tooMany *streams.TooManyChunksError
		require.ErrorAs(t, append(), &tooMany, name)
		require.Equal(t, 3, tooMany.Limit)
	}
	info, err := svc.Info(ctx, org, "run-1", "over")
	require.NoError(t, err)
	require.Equal(t, streams.Info{TailIndex: -1}, info, "nothing was written")
}

func TestAnEmptyAppendIsInvalid(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	_, err := svc.Append(context.Background(), org, "run-1", "out", nil)
	requireInvalid(t, "chunks", err)
}

func TestDatabaseFailuresAreReturnedWrapped(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := svc.Append(ctx, org, "run-1", "out", [][]byte{{1}})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, streams.ErrClosed)
	require.ErrorIs(t, svc.Close(ctx, org, "run-1", "out"), context.Canceled)
	_, err = svc.Info(ctx, org, "run-1", "out")
	require.ErrorIs(t, err, context.Canceled)
	_, err = svc.Chunks(ctx, org, "run-1", "out", 0, 10)
	require.ErrorIs(t, err, context.Canceled)
	_, err = svc.ListNames(ctx, org, "run-1", "", 10)
	require.ErrorIs(t, err, context.Canceled)
	_, err = svc.PurgeClosedBefore(ctx, time.Now())
	require.ErrorIs(t, err, context.Canceled)
}

func TestMetricsCountAppendsAndLiveSubscribers(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, _ := newService(t, streams.Config{Registry: reg})
	mustAppend(t, svc, org, "run-1", "out", "abc", "de")
	tail, err := svc.Tail(org, "run-1", "out", 0)
	require.NoError(t, err)

	require.Equal(t, 2.0, metricValue(t, reg, "reveille_streams_chunks_appended_total"))
	require.Equal(t, 5.0, metricValue(t, reg, "reveille_streams_bytes_appended_total"))
	require.Equal(t, 1.0, metricValue(t, reg, "reveille_streams_live_subscribers"))
	tail.Close()
	tail.Close()
	require.Equal(t, 0.0, metricValue(t, reg, "reveille_streams_live_subscribers"), "closing twice counts once")
}

// metricValue reads an unlabelled counter or gauge.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestConfigDefaults(t *testing.T) {
	d := streams.Config{}.WithDefaults()
	require.EqualValues(t, 1<<20, d.MaxChunk)
	require.EqualValues(t, 8<<20, d.MaxRequest)
	require.Equal(t, 1000, d.MaxChunksPerRequest)
	require.Equal(t, 7*24*time.Hour, d.Retention)
	require.Equal(t, 15*time.Second, d.KeepAlive)
}

func TestNewRefusesBadConfigAndNoDatabase(t *testing.T) {
	_, err := streams.New(nil, streams.Config{})
	require.Error(t, err)
	db := testkit.NewPool(t)
	_, err = streams.New(db, streams.Config{MaxChunk: 100, MaxRequest: 10})
	require.ErrorContains(t, err, "exceeds MaxRequest")
	// (a live reader gets a chunk as one line of base64: the Go client's
	// line bound holds the largest)
	_, err = streams.New(db, streams.Config{MaxChunk: streams.MaxChunkLimit + 1, MaxRequest: 64 << 20})
	require.ErrorContains(t, err, "exceeds 16777216 (16 MiB)")
	_, err = streams.New(db, streams.Config{MaxChunk: streams.MaxChunkLimit, MaxRequest: 64 << 20})
	require.NoError(t, err)
	_, err = streams.New(db, streams.Config{Retention: -time.Hour})
	require.ErrorContains(t, err, "negative")
	reg := prometheus.NewRegistry()
	_, err = streams.New(db, streams.Config{Registry: reg})
	require.NoError(t, err)
	_, err = streams.New(db, streams.Config{Registry: reg})
	require.ErrorContains(t, err, "registering streams metrics", "two services cannot share one registry's names")
}

func TestStartTwiceFailsAndStopTwiceIsSafe(t *testing.T) {
	db := testkit.NewPool(t)
	never, err := streams.New(db, streams.Config{Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, never.Stop(context.Background()), "stopping a service never started")
	require.NoError(t, never.Stop(context.Background()))

	svc, err := streams.New(db, streams.Config{Logger: testkit.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	require.ErrorIs(t, svc.Start(context.Background()), startstop.ErrStarted)
	require.NoError(t, svc.Stop(context.Background()))
	require.NoError(t, svc.Stop(context.Background()))
	require.ErrorIs(t, svc.Start(context.Background()), startstop.ErrStarted, "a stopped service stays stopped")
}

func TestStartFailsWhenTheDatabaseIsUnreachable(t *testing.T) {
	db := testkit.NewPool(t)
	svc, err := streams.New(db, streams.Config{Logger: testkit.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Error(t, svc.Start(ctx))
	require.NoError(t, svc.Start(context.Background()), "a failed start may be retried")
	require.NoError(t, svc.Stop(context.Background()))
}

// A notification is at most 8000 bytes, so an absurdly long org id makes it
// fail: after a committed append that is only logged (a retry would store
// the chunks twice), inside a caller's transaction it fails the append.
func TestAFailedNotificationNeverLosesOrDuplicatesAnAppend(t *testing.T) {
	svc, db := newService(t, streams.Config{})
	ctx := context.Background()
	longOrg := strings.Repeat("o", 8000)
	r, err := svc.Append(ctx, longOrg, "run-1", "out", [][]byte{[]byte("kept")})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 0}, r)
	require.Equal(t, []string{"kept"}, dataOf(readAll(t, svc, longOrg, "run-1", "out", 10)))

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = svc.AppendTx(ctx, tx, longOrg, "run-1", "out", [][]byte{[]byte("lost with its transaction")})
	require.ErrorContains(t, err, "appending to stream run-1/out")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, []string{"kept"}, dataOf(readAll(t, svc, longOrg, "run-1", "out", 10)))
}

func TestByteBoundedPagesCountBytesAcrossAppends(t *testing.T) {
	svc, _ := newService(t, streams.Config{MaxChunk: 600, MaxRequest: 1000})
	ctx := context.Background()
	for _, sizes := range [][]int{{100, 300}, {600, 50}, {400}} {
		batch := make([][]byte, len(sizes))
		for i, n := range sizes {
			batch[i] = make([]byte, n)
		}
		_, err := svc.Append(ctx, org, "run-1", "mixed", batch)
		require.NoError(t, err)
	}
	for start, want := range map[int64]int{0: 3, 1: 3, 2: 2, 3: 2, 4: 1} {
		p, err := svc.Chunks(ctx, org, "run-1", "mixed", start, 500)
		require.NoError(t, err)
		require.Len(t, p.Items, want, "from %d: as many chunks as fit in 1000 bytes", start)
		require.Equal(t, start+int64(want) < 5, p.HasMore)
	}
}

func TestAnAppendRetriedWithItsKeyAppendsNothingAndGetsItsIndexesBack(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	two := [][]byte{[]byte("a"), []byte("b")}
	r, err := svc.AppendWithKey(ctx, org, "run-1", "out", "k1", two)
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 1}, r)
	r, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k1", two)
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 1}, r, "the retry gets the first indexes")

	r, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k2", [][]byte{[]byte("c")})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 2, LastIndex: 2}, r)
	r, err = svc.AppendWithKey(ctx, org, "run-1", "other", "k1", [][]byte{[]byte("x")})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 0}, r, "keys are per stream")
	r, err = svc.AppendWithKey(ctx, otherOrg, "run-1", "out", "k1", [][]byte{[]byte("y")})
	require.NoError(t, err)
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 0}, r, "and per org")

	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	r, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k1", two)
	require.NoError(t, err, "a retry of an append that committed before the close still succeeds")
	require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 1}, r)
	_, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k3", two)
	require.ErrorIs(t, err, streams.ErrClosed)
	require.Equal(t, []string{"a", "b", "c"}, dataOf(readAll(t, svc, org, "run-1", "out", 10)))
}

// A key names one append: used again on the stream for other chunks — by
// another caller of the org, or once the HTTP layer forgot the key — it
// is refused, not answered with the first append's indexes while the new
// chunks are dropped.
func TestAKeyUsedAgainForOtherChunksIsRefusedAndAppendsNothing(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ctx := context.Background()
	_, err := svc.AppendWithKey(ctx, org, "run-1", "out", "k1", [][]byte{[]byte("ab")})
	require.NoError(t, err)
	for _, other := range [][][]byte{
		{[]byte("other")},
		{[]byte("a"), []byte("b")}, // the same bytes, cut otherwise
		{[]byte("ab"), []byte("")},
	} {
		_, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k1", other)
		require.ErrorIs(t, err, streams.ErrKeyReused, "%q", other)
	}
	require.NoError(t, svc.Close(ctx, org, "run-1", "out"))
	_, err = svc.AppendWithKey(ctx, org, "run-1", "out", "k1", [][]byte{[]byte("late")})
	require.ErrorIs(t, err, streams.ErrKeyReused, "after the close too")
	require.Equal(t, []string{"ab"}, dataOf(readAll(t, svc, org, "run-1", "out", 10)))
}

func TestConcurrentUsesOfOneKeyAppendOnce(t *testing.T) {
	svc, _ := newService(t, streams.Config{})
	ranges := make([]streams.Range, 8)
	var wg sync.WaitGroup
	for i := range ranges {
		wg.Go(func() {
			r, err := svc.AppendWithKey(context.Background(), org, "run-1", "out", "same", [][]byte{[]byte("once")})
			assertNoError(t, err)
			ranges[i] = r
		})
	}
	wg.Wait()
	for _, r := range ranges {
		require.Equal(t, streams.Range{FirstIndex: 0, LastIndex: 0}, r)
	}
	require.Equal(t, []string{"once"}, dataOf(readAll(t, svc, org, "run-1", "out", 10)))
}

// A purge's batches follow the heap, not the indexes: chunk 0 may go while
// 1–29 are still stored. A page from 0 has nothing to give and goes on to
// the first stored chunk, not past the whole window (chunks 1–9 would be
// skipped by a reader following next_cursor).
func TestAPageAtAHoleDoesNotSkipStoredChunks(t *testing.T) {
	svc, db := newService(t, streams.Config{Retention: 10 * 365 * 24 * time.Hour})
	ctx := context.Background()
	chunks := make([][]byte, 30)
	for i := range chunks {
		chunks[i] = fmt.Appendf(nil, "c%d", i)
	}
	_, err := svc.Append(ctx, org, "run", "out", chunks)
	require.NoError(t, err)
	require.NoError(t, svc.Close(ctx, org, "run", "out"))
	_, err = db.Exec(ctx, `DELETE FROM stream_chunks WHERE chunk_index = 0`) // a purge's first batch
	require.NoError(t, err)
	p, err := svc.Chunks(ctx, org, "run", "out", 0, 10)
	require.NoError(t, err)
	require.Empty(t, p.Items)
	require.Equal(t, int64(1), p.Next, "next cursor skips stored chunks 1..%d", p.Next-1)
}

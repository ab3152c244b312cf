package client_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// Retention purges a closed stream whole, in batches that follow the heap,
// not the indexes: its chunks, then its row. A reader paging it meanwhile
// must not see the stream end early without a word (Tail says
// ErrStreamGap for the same stream): neither at a hole a purge under way
// leaves (chunks 10–19 gone, 20–29 still stored), nor when the purge
// finished between two pages (the next page says nothing is stored, as
// for a stream that ended there).
func TestChunksDoesNotEndSilentlyWhereAPurgeTookChunks(t *testing.T) {
	for _, tc := range []struct {
		name            string
		before, afterP1 []string // SQL run before reading, and once the first page was read
	}{
		{name: "a hole a purge under way leaves", before: []string{`DELETE FROM stream_chunks WHERE chunk_index BETWEEN 10 AND 19`}},
		{name: "a purge that finished between two pages",
			afterP1: []string{`DELETE FROM stream_chunks`, `DELETE FROM stream_appends`, `DELETE FROM streams WHERE done`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngine(t)
			ctx := context.Background()
			c := newClient(t, e.url, agent, nil)
			var chunks [][]byte
			for i := range 30 {
				chunks = append(chunks, fmt.Appendf(nil, "c%d", i))
			}
			_, err := c.Streams.AppendBatch(ctx, "run", "out", chunks)
			require.NoError(t, err)
			require.NoError(t, c.Streams.Close(ctx, "run", "out"))
			exec := func(sqls []string) {
				for _, sql := range sqls {
					_, err := e.svc.DB().Exec(ctx, sql)
					require.NoError(t, err)
				}
			}
			exec(tc.before)

			var got []int64
			var iterErr error
			for ch, err := range c.Streams.Chunks(ctx, "run", "out", client.ChunkParams{Limit: 5}) {
				if err != nil {
					iterErr = err
					break
				}
				got = append(got, ch.Index)
				if ch.Index == 4 {
					exec(tc.afterP1)
				}
			}
			require.ErrorIs(t, iterErr, client.ErrStreamGap, "Chunks ended without an error after chunk %d of 30", got[len(got)-1])
		})
	}
}

// A negative page size or seq is out of the documented range (Limit
// 1–500; 0 the default): like a negative StartIndex, it must reach the
// server and be its 400, not be read silently as the default.
func TestANegativeLimitOrAfterIsAnErrorNotTheDefault(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	asAdmin := newClient(t, e.url, admin, nil)
	for i := range 3 {
		_, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: fmt.Sprint("neg-", i), Scope: "s", Budget: 1})
		require.NoError(t, err)
	}
	p, err := asAdmin.Mandates.ListPage(ctx, client.MandateListParams{PageParams: client.PageParams{Limit: -1}})
	require.Error(t, err, "Limit -1 answered a page of %d mandates", len(p.Items))
}

package client_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A closed stream that retention is purging (in batches that follow the
// heap, not the indexes) has a hole: chunks 10–19 gone, 20–29 still
// stored. Chunks says it iterates over the chunks stored now; it must not
// end as if the stream ended at 9 without a word (Tail says ErrStreamGap
// for the same stream).
func TestChunksDoesNotEndSilentlyAtAHoleAPurgeLeaves(t *testing.T) {
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
	_, err = e.svc.DB().Exec(ctx, `DELETE FROM stream_chunks WHERE chunk_index BETWEEN 10 AND 19`)
	require.NoError(t, err)

	var got []int64
	var iterErr error
	for ch, err := range c.Streams.Chunks(ctx, "run", "out", client.ChunkParams{Limit: 5}) {
		if err != nil {
			iterErr = err
			break
		}
		got = append(got, ch.Index)
	}
	info, err := c.Streams.Info(ctx, "run", "out")
	require.NoError(t, err)
	if iterErr == nil {
		require.Equal(t, info.TailIndex, got[len(got)-1],
			"Chunks ended without an error at chunk %d of a stream whose tail_index is %d (chunks %d.. still stored)", got[len(got)-1], info.TailIndex, 20)
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

package client_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/streams"
)

// Tail reads every chunk the server can accept, as Chunks does: the
// largest (streams.MaxChunkLimit) goes to a live reader as one SSE line of
// base64, within the client's line bound. REVEILLE_STREAM_MAX_CHUNK had no
// upper bound, and Tail ended for good at a 25 MiB chunk ("a line longer
// than 33554432 bytes") that Chunks read.
func TestTailReadsTheLargestChunkTheServerAccepts(t *testing.T) {
	e := startEngine(t, func(c *service.Config) {
		c.Streams.MaxChunk = streams.MaxChunkLimit
		c.Streams.MaxRequest = 2 * streams.MaxChunkLimit
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writer := newClient(t, e.url, agent, nil)
	big := bytes.Repeat([]byte("x"), streams.MaxChunkLimit)
	_, err := writer.Streams.Append(ctx, "run", "out", big)
	require.NoError(t, err, "the server accepts the chunk")
	require.NoError(t, writer.Streams.Close(ctx, "run", "out"))

	reader := newClient(t, e.url, approver, nil)
	var paged int
	for ch, err := range reader.Streams.Chunks(ctx, "run", "out", client.ChunkParams{}) {
		require.NoError(t, err)
		paged += len(ch.Data)
	}
	require.Equal(t, len(big), paged, "Chunks reads it")
	var tailed int
	for ch, err := range reader.Streams.Tail(ctx, "run", "out", client.TailParams{}) {
		require.NoError(t, err)
		tailed += len(ch.Data)
	}
	require.Equal(t, len(big), tailed, "Tail reads it too")
}

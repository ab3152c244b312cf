package client_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// The idle timeout covers the wait for the answer's headers, the token
// function's included: a slow token source (an identity provider slower
// than the idle timeout) is cut by it, and the reader reconnects as after
// any idle timeout — the token function did not refuse.
func TestATokenFetchCutByTheReadersIdleTimeoutIsTriedAgain(t *testing.T) {
	srv := newScriptedSSE(t, eventStream("id: 0\ndata: YQ==\n\nevent: end\ndata: {\"tail_index\": 0}\n\n"))
	var asked atomic.Int32
	c, err := client.New(srv.url, client.WithTokenFunc(func(ctx context.Context) (string, error) {
		if asked.Add(1) == 1 {
			<-ctx.Done() // a slow token source: the watchdog gives up on it
			return "", ctx.Err()
		}
		return "tok", nil
	}), fastReconnect())
	require.NoError(t, err)
	// (the deadline only ends the test should the reader never finish)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var chunks []client.StreamChunk
	for ch, err := range c.Streams.Tail(ctx, "run", "out", client.TailParams{IdleTimeout: 50 * time.Millisecond}) {
		require.NoError(t, err)
		chunks = append(chunks, ch)
	}
	require.Equal(t, []client.StreamChunk{{Index: 0, Data: []byte("a")}}, chunks)
}

package streams_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// An append in a caller's transaction that rolls back appended nothing:
// reveille_streams_{chunks,bytes}_appended_total must not count it.
func TestARolledBackAppendTxIsNotCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, db := newService(t, streams.Config{Registry: reg})
	ctx := context.Background()

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = svc.AppendTx(ctx, tx, org, "run-1", "out", [][]byte{[]byte("ghost")})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	require.Empty(t, readAll(t, svc, org, "run-1", "out", 10), "nothing was appended")
	require.Equal(t, 0.0, metricValue(t, reg, "reveille_streams_chunks_appended_total"))
	require.Equal(t, 0.0, metricValue(t, reg, "reveille_streams_bytes_appended_total"))
}

package workpool

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// A loop learns of work enqueued through any replica by the enqueue's
// NOTIFY on its replica's LISTEN connection, and an idle loop sets no
// timer. When that connection goes silent without being closed (its peer
// vanished: a NAT or firewall forgot it), the listener's ping finds out
// and it listens again, waking the loops: the work starts.
func TestWorkEnqueuedAfterTheLeadersListenConnectionWentSilentStillStarts(t *testing.T) {
	t.Parallel()
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	dbA := testkit.NewPoolFor(t, relayed) // replica a reaches Postgres through the relay
	dbB := testkit.NewPoolFor(t, dsn)
	a := startManager(t, dbA, Config{Pools: map[string]int{"default": 5}})
	requireLoopSettled(t, dbA, a, "default", "idle")
	b := startManager(t, dbB, Config{Pools: map[string]int{"default": 5}})
	require.Same(t, a, leaderOf(a, b))

	relay.Silence(a.listener.conn.Load().PgConn().Conn().LocalAddr())
	id, err := b.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	// (a's lock connection and its others are healthy: a leads on)
	requireFinished(t, b, "org-1", id, OutcomeSucceeded)
	require.Same(t, a, leaderOf(a, b))
}

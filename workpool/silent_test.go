package workpool

import (
	"context"
	"testing"
	"time"

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

// silentConfig bounds the pool's statements tightly, so that a statement
// whose answer never comes gives up within the test's wait.
var silentConfig = Config{Pools: map[string]int{"default": 5}, StatementTimeout: time.Second, HookTimeout: time.Second}

// A record of results whose connection goes silent (a NAT or firewall that
// forgot it, a failover that left it blackholed) gives up and is tried
// again: every result behind it would wait for the kernel (minutes), work
// that ran staying "running", its hook (a wake-up's signal) not called.
func TestARecordOnASilentConnectionGivesUpAndTheResultsBehindItAreRecorded(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	arrived, release := relay.HoldReplyTo("AS c(id, attempt, kind, result, error, retryable)")
	t.Cleanup(release) // (before the relay's cut and the pool's close)
	m := startManager(t, db, silentConfig)
	first, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	<-arrived // the first record went out; its answer never comes back
	second, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", second, OutcomeSucceeded)
	requireFinished(t, m, "org-1", first, OutcomeSucceeded)
}

// A loop iteration whose connection goes silent gives up: the replica
// keeps the leadership (its lock connection is healthy), so no other
// replica's loop would take over, and nothing of the pool would start
// until the kernel gave up on the connection.
func TestALoopIterationOnASilentConnectionGivesUpAndThePoolGoesOn(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	arrived, release := relay.HoldReplyTo("set_config('synchronous_commit', 'off', true), set_config('idle_in_transaction_session_timeout', $1, true)")
	t.Cleanup(release)
	m := startManager(t, db, silentConfig)
	<-arrived // a full iteration's first round trip went out; its answer never comes back
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.True(t, m.loopFor("default").leading.Load(), "the same replica leads on")
}

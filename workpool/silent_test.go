package workpool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// silentHookMarker is a statement the silent-connection tests' hook runs,
// for the relay to find.
const silentHookMarker = "SELECT 'reveille: a hook statement'"

// startManagerWithMarkerHook starts a manager whose hook "marker" runs
// silentHookMarker in the completing transaction, counting its calls.
func startManagerWithMarkerHook(t *testing.T, db *pgxpool.Pool, calls *atomic.Int64) *Manager {
	// (a heartbeat timeout past the record's bound: the silent record's
	// statement holds the work's row on the server until it gives up, the
	// work's heartbeats waiting on it, and recovery would otherwise race
	// the record made again — counting as failed an attempt that succeeded,
	// which is recovery's to do for a replica that looks dead, not this
	// test's subject)
	cfg := silentConfig
	cfg.HeartbeatTimeout = 30 * time.Second
	m := startManager(t, db, cfg)
	m.RegisterHook("marker", func(ctx context.Context, tx pgx.Tx, c Completion) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, silentHookMarker)
		return err
	})
	return m
}

// A record whose connection goes silent after its first round trip — in
// a hook's statement, as every wake-up's work has a hook — gives up and
// is tried again: its hooks' statements run under the completer's own
// context (a hook's statement begun in time runs to its end), so nothing
// else would end the wait, and every later result of the replica would
// queue behind it.
func TestARecordWithHooksSilentInItsMiddleGivesUpAndIsRecordedAgain(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	arrived, release := relay.HoldReplyTo(silentHookMarker)
	t.Cleanup(release)
	var calls atomic.Int64
	m := startManagerWithMarkerHook(t, db, &calls)
	first, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		OnComplete: &OnComplete{Hook: "marker"}})
	require.NoError(t, err)
	<-arrived // the hook's statement went out; its answer never comes back
	second, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", first, OutcomeSucceeded)
	requireFinished(t, m, "org-1", second, OutcomeSucceeded)
	require.GreaterOrEqual(t, calls.Load(), int64(2), "the hook was called again")
}

// A loop iteration whose connection goes silent after its first round
// trips (here at its outlook, the read of what waits) gives up, and the
// pool goes on under the same leader.
func TestALoopIterationSilentAfterItsFirstRoundTripsGivesUp(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	arrived, release := relay.HoldReplyTo("AND w.concurrency_key IS NULL AND w.run_at > $2) AS next_at")
	t.Cleanup(release)
	m := startManager(t, db, silentConfig)
	<-arrived // an idle iteration's outlook went out; its answer never comes back
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.True(t, m.loopFor("default").leading.Load(), "the same replica leads on")
}

// The save of the fair-share ledger after an iteration, on a connection
// gone silent, gives up: under the leadership's context alone the loop
// stopped mid-term, work enqueued later never starting while this replica
// kept the lock.
func TestASaveOfTheTurnsOnASilentConnectionGivesUpAndThePoolGoesOn(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	m := startManager(t, db, silentConfig) // StatementTimeout 1 s
	requireLoopSettled(t, db, m, "default", "idle")
	time.Sleep(1500 * time.Millisecond) // past turnsSaveEvery since the term's read of the ledger
	muted := relay.SilenceAt("SELECT 1 FROM workpool_pools WHERE name = $1 AND generation = $2 FOR SHARE")
	// (work of two orgs in one commit: a fair pick, which charges the ledger)
	var ps []EnqueueParams
	for i := range 10 {
		ps = append(ps, EnqueueParams{OrgID: []string{"org-1", "org-2"}[i%2], Pool: "default", Handler: "noop"})
	}
	_, err := m.EnqueueMany(context.Background(), ps)
	require.NoError(t, err)
	select {
	case <-muted:
	case <-time.After(20 * time.Second):
		t.Fatal("the save of the turns never went out")
	}
	second, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", second, OutcomeSucceeded) // waits 20 s
}

// A new term's read of the fair-share turns on a connection gone silent
// gives up: under the leadership's context alone (which ends only when the
// lock's own, healthy, connection fails) the pool's loop never began, and
// no other replica took over — nothing of the pool started anywhere.
func TestATermsReadOfTheTurnsOnASilentConnectionGivesUpAndThePoolStarts(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	muted := relay.SilenceAt("(SELECT turn_num FROM workpool_fair_clocks WHERE pool = $1)")
	m := startManager(t, db, silentConfig) // StatementTimeout 1 s
	select {
	case <-muted:
	case <-time.After(20 * time.Second):
		t.Fatal("the read of the turns never went out")
	}
	id, err := m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
}

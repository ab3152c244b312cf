//go:build faults

package faults

import (
	"context"
	"errors"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// SIGTERM with work running: the replica stops claiming, lets the work
// that fits in REVEILLE_SHUTDOWN_GRACE finish, sends its signal, hands the
// rest back — which another replica then starts at once, long before the
// heartbeat timeout — and exits 0.
func TestSigtermDrainsWithinTheGraceAndHandsBackTheRest(t *testing.T) {
	const grace = 5 * time.Second
	// A heartbeat timeout far beyond the test: work that is not handed
	// back would not be recovered in time.
	e := newEnv(t, func(o *envOptions) {
		o.settings = map[string]string{"REVEILLE_SHUTDOWN_GRACE": grace.String(), "REVEILLE_HEARTBEAT_TIMEOUT": "10m"}
		o.start = 1 // the work runs on replica a
	})
	c := e.client(0)
	e.fund(c, 100)
	short := e.wakeMany([]*client.Client{c}, 1, 2500) // finishes within the grace
	long := e.wakeMany([]*client.Client{c}, 2, 10000) // does not
	e.waitRunning(3)

	sent := time.Now()
	e.replicas[0].p.signal(syscall.SIGTERM)
	require.NoError(t, e.replicas[0].p.wait(grace+20*time.Second), "the replica exits after its grace")
	took := time.Since(sent)
	require.Equal(t, 0, e.replicas[0].p.exitCode(), "a drained replica exits 0:\n%s", e.replicas[0].p.logTail(10))
	// It sent the signal of what finished before it exited: the message is
	// delivered already, and no other replica runs yet.
	require.EqualValues(t, 1, e.count(`SELECT count(*) FROM queue_messages WHERE org_id = $1 AND queue = 'wakeup' AND idempotency_key = $2 AND status = 'delivered'`,
		org, short[0].wakeupID), "the finished work's signal is sent before the replica exits")
	e.replicas[1].start() // takes over what a handed back
	t.Logf("SIGTERM to exit: %s (grace %s)", took.Round(time.Millisecond), grace)

	var attempts int
	var finished time.Time
	require.NoError(t, e.db.QueryRow(context.Background(),
		`SELECT w.attempts, w.finished_at FROM workpool_work w JOIN wakeups u ON u.work_id = w.id WHERE u.id = $1`, short[0].wakeupID).Scan(&attempts, &finished))
	require.Equal(t, 1, attempts, "the short work finished on its first attempt")
	require.True(t, finished.After(sent), "… during the drain")
	// Handed back, the long work runs on replica b within seconds — the
	// heartbeat timeout is ten minutes.
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM workpool_work w JOIN wakeups u ON u.work_id = w.id
			WHERE u.id = ANY($1::uuid[]) AND w.state IN ('running', 'finished')`, []string{long[0].wakeupID, long[1].wakeupID}) == 2
	}, 15*time.Second, 50*time.Millisecond, "the handed-back work runs again at once")
	e.requireWoken(append(short, long...))
	// Handed back without an attempt counted (docs/operations.md): the long
	// work's one counted attempt is replica b's.
	for _, w := range long {
		require.EqualValues(t, 1, e.count(`SELECT w.attempts FROM workpool_work w JOIN wakeups u ON u.work_id = w.id WHERE u.id = $1`, w.wakeupID),
			"the handed-back attempt is not counted")
	}
}

// A second SIGTERM does not wait for the drain: the process exits at once,
// non-zero. Its running work is then recovered after the heartbeat
// timeout, as after a kill.
func TestASecondSigtermExitsAtOnce(t *testing.T) {
	e := newEnv(t, func(o *envOptions) {
		o.settings = map[string]string{"REVEILLE_SHUTDOWN_GRACE": "10m"}
		o.start = 1
	})
	c := e.client(0)
	e.fund(c, 100)
	ws := e.wakeMany([]*client.Client{c}, 1, 5000)
	e.waitRunning(1)

	p := e.replicas[0].p
	p.signal(syscall.SIGTERM)
	require.Never(t, p.exited, time.Second, 50*time.Millisecond, "the first SIGTERM drains: the work still runs")
	p.signal(syscall.SIGTERM)
	require.NoError(t, p.wait(5*time.Second), "the second SIGTERM exits at once")
	require.NotEqual(t, 0, p.exitCode(), "a forced exit is not a clean one")
	require.Contains(t, p.logTail(5), "again: exiting without waiting for the drain")

	e.replicas[1].start()
	e.requireWoken(ws)
}

// A kill between a wake-up's committed spend and the enqueue of its work
// (REVEILLE_FAULT_CRASH_AT=after-spend-commit, compiled into the suite's
// build only): the other replica's reconciler enqueues the funded intent.
// One debit, one wake.
//
// The caller's retry with the same Idempotency-Key is not part of it: the
// dead request's claim on the key counts as abandoned only after two
// minutes (api.idempotencyAbandoned), and until then a retry waits and is
// answered 409 idempotency-key-in-flight.
func TestAKillBetweenSpendAndEnqueueLeavesOneDebitAndOneWake(t *testing.T) {
	e := newEnv(t, func(o *envOptions) { o.start = 1 })
	e.replicas[1].settings["REVEILLE_FAULT_CRASH_AT"] = "after-spend-commit"
	e.replicas[1].start()
	healthy, crashing := e.client(0), e.client(1, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	m := e.fund(healthy, 100)

	var w parked
	w.workflowID, w.run = e.park()
	_, err := crashing.Wakeups.Create(t.Context(), e.wakeRequest(w.workflowID, 200))
	require.Error(t, err, "the replica died mid-request")
	var netErr *net.OpError
	var urlErr *url.Error
	require.True(t, errors.As(err, &urlErr) || errors.As(err, &netErr), "a connection error, not an answer: %v", err)
	require.NoError(t, e.replicas[1].p.wait(10*time.Second), "the crash point killed the replica")
	require.NoError(t, e.db.QueryRow(context.Background(), `SELECT id::text FROM wakeups WHERE org_id = $1 AND workflow_id = $2`,
		org, w.workflowID).Scan(&w.wakeupID), "the spend committed")

	e.requireWoken([]parked{w})
	got, err := healthy.Mandates.Get(t.Context(), m.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, got.Spent, "one debit")
	require.EqualValues(t, 1, e.count(`SELECT count(*) FROM workpool_work WHERE org_id = $1`, org), "its work was enqueued once")
}

package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

const (
	testWait = 10 * time.Second
	testTick = 10 * time.Millisecond
)

// recordingSignaler stands in for Temporal, which queue's tests run
// without: it records every signal and accepts it, or, while held, blocks
// each call until released (or its context ends).
type recordingSignaler struct {
	mu    sync.Mutex
	calls map[string]int // by workflow id
	hold  chan struct{}  // when non-nil, calls wait for it to close
}

func newRecordingSignaler() *recordingSignaler { return &recordingSignaler{calls: map[string]int{}} }

func (r *recordingSignaler) SignalWorkflow(ctx context.Context, workflowID, _, _ string, _ any) error {
	r.mu.Lock()
	r.calls[workflowID]++
	hold := r.hold
	r.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *recordingSignaler) count(workflowID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[workflowID]
}

func startDispatcher(t *testing.T, db *pgxpool.Pool, s Signaler, cfg DispatcherConfig) *Dispatcher {
	t.Helper()
	cfg.Logger = testkit.Logger(t)
	d := NewDispatcher(db, s, cfg)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, d.Stop(context.Background())) })
	return d
}

func signalParams(workflowID string) EnqueueParams {
	return EnqueueParams{OrgID: "o", Queue: "q", IdempotencyKey: workflowID, Payload: json.RawMessage(`{}`),
		Signal: &Signal{WorkflowID: workflowID, Name: "wake"}}
}

// enqueueForHandoff writes p in a transaction of its own and returns the
// handoff once it committed.
func enqueueForHandoff(t *testing.T, db *pgxpool.Pool, d *Dispatcher, p EnqueueParams) *Handoff {
	t.Helper()
	var h *Handoff
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		var err error
		_, h, err = d.EnqueueForHandoff(context.Background(), tx, p)
		return err
	})
	require.NoError(t, err)
	require.NotNil(t, h)
	return h
}

// stopWhileASendIsHeld stops d while sig holds a send in flight, then lets
// that send finish within the stop, and waits for the stop to end.
func stopWhileASendIsHeld(t *testing.T, d *Dispatcher, sig *recordingSignaler) {
	t.Helper()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	require.Eventually(t, func() bool { return !d.life.Running() }, testWait, testTick)
	close(sig.hold)
	require.NoError(t, <-stopped)
}

// requireDelivered waits until the org's message with the key is delivered.
func requireDelivered(t *testing.T, db *pgxpool.Pool, key string) Message {
	t.Helper()
	var m Message
	require.Eventually(t, func() bool {
		var err error
		m, err = GetByKey(context.Background(), db, "o", "q", key)
		require.NoError(t, err)
		return m.Status == StatusDelivered
	}, testWait, testTick)
	return m
}

// listener is a connection listening on the dispatchers' channel.
func listener(t *testing.T, db *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	conn, err := db.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "UNLISTEN "+notifyChannel)
		conn.Release()
	})
	_, err = conn.Exec(context.Background(), "LISTEN "+notifyChannel)
	require.NoError(t, err)
	return conn
}

func TestAHandedOffMessageIsSentAfterItsCommitWithoutANotificationOrAClaim(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := newRecordingSignaler()
	// The lease outlasts the test: no claim can take the message, only the
	// handoff can send it.
	d := startDispatcher(t, db, sig, DispatcherConfig{HandoffLease: time.Hour})
	l := listener(t, db)

	// The listener hears the plain path's notification…
	_, _, err := Enqueue(ctx, db, signalParams("o/plain"))
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, testWait)
	_, err = l.Conn().WaitForNotification(wctx)
	cancel()
	require.NoError(t, err, "the plain path notifies")
	requireDelivered(t, db, "o/plain")

	h := enqueueForHandoff(t, db, d, signalParams("o/handed"))
	require.True(t, d.Handoff(h))

	m := requireDelivered(t, db, "o/handed")
	require.Equal(t, 1, sig.count("o/handed"))
	require.Equal(t, 1, m.Attempts, "the insert was the only claim")
	// …and none from the handoff's: a round trip on the listening
	// connection lets any notification sent at the commit arrive first.
	_, err = l.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	wctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = l.Conn().WaitForNotification(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the handoff path notifies no one")
}

// A dispatcher that writes a message for handoff and dies before sending it
// leaves it leased; a dispatcher asleep since before the write (nothing
// notified it) looks again within the lease and sends it, once.
func TestAHandedOffMessageWhoseWriterDiedIsSentOnceByAnotherDispatcherAfterItsLease(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	cfg := DispatcherConfig{SendTimeout: 100 * time.Millisecond, HandoffLease: 500 * time.Millisecond}
	deadSig, otherSig := newRecordingSignaler(), newRecordingSignaler()
	startDispatcher(t, db, otherSig, cfg)
	// Its one due message sent, the other dispatcher sleeps until the next
	// due time it knows of (the plain message's claim lease, 30 s) or the
	// longest sleep: none is due.
	_, _, err := Enqueue(ctx, db, signalParams("o/before"))
	require.NoError(t, err)
	requireDelivered(t, db, "o/before")

	cfg.Logger = testkit.Logger(t)
	dead := NewDispatcher(db, deadSig, cfg)
	require.NoError(t, dead.Start(ctx))
	enqueueForHandoff(t, db, dead, signalParams("o/handed"))
	require.NoError(t, dead.Stop(ctx)) // dies before handing it off

	m := requireDelivered(t, db, "o/handed")
	require.Equal(t, 1, otherSig.count("o/handed"), "sent once")
	require.Zero(t, deadSig.count("o/handed"))
	require.Equal(t, 2, m.Attempts, "the writer's claim, then the other dispatcher's")
}

// The handoff's lease is a claim like any other: hidden from claims while
// it lasts, found by the due-poll once it ends.
func TestAHandedOffMessageIsHiddenFromClaimsUntilItsLeaseEnds(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	writer := startDispatcher(t, db, newRecordingSignaler(), DispatcherConfig{HandoffLease: time.Hour})
	poller := NewDispatcher(db, nil, DispatcherConfig{})
	h := enqueueForHandoff(t, db, writer, signalParams("o/handed"))

	msgs, err := poller.claim(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, msgs, "leased to its writer")
	wait, _ := poller.untilNextDue(ctx, nil)
	require.Greater(t, wait, time.Duration(0))
	require.LessOrEqual(t, wait, poller.cfg.HandoffLease, "an idle dispatcher looks again within a handoff lease")

	_, err = db.Exec(ctx, `UPDATE queue_messages SET next_attempt_at = now() WHERE id = $1`, h.m.ID) // the lease ends
	require.NoError(t, err)
	msgs, err = poller.claim(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, h.m.ID, msgs[0].ID)
	require.Equal(t, 2, msgs[0].Attempts)
}

// A rolled-back transaction leaves no message behind: the lease and the
// send live and die with it. (Handing off only after the commit is the
// caller's part; the wakeup tests drive it through the pool's AfterCommit,
// with a commit that fails.)
func TestARolledBackHandoffLeavesNoMessage(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	d := startDispatcher(t, db, newRecordingSignaler(), DispatcherConfig{})
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, h, err := d.EnqueueForHandoff(ctx, tx, signalParams("o/rolled-back"))
	require.NoError(t, err)
	require.NotNil(t, h)
	require.NoError(t, tx.Rollback(ctx))

	_, err = GetByKey(ctx, db, "o", "q", "o/rolled-back")
	require.ErrorIs(t, err, ErrNotFound)
}

// Handoff is called where nothing may block (after a commit, on the
// committing goroutine): with the pipeline and the handoff queue full it
// drops the handoff and returns, and the message waits for its lease.
func TestAHandoffIntoAFullDispatcherReturnsAtOnceAndLeavesTheMessageToItsLease(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := newRecordingSignaler()
	sig.hold = make(chan struct{})
	d := startDispatcher(t, db, sig, DispatcherConfig{BatchSize: 1, Concurrency: 1, HandoffLease: time.Hour})

	first := enqueueForHandoff(t, db, d, signalParams("o/first"))
	require.True(t, d.Handoff(first))
	require.Eventually(t, func() bool { return sig.count("o/first") == 1 }, testWait, testTick, "in flight, holding the one slot")
	queued := enqueueForHandoff(t, db, d, signalParams("o/queued"))
	require.True(t, d.Handoff(queued), "waits in the handoff queue")
	dropped := enqueueForHandoff(t, db, d, signalParams("o/dropped"))
	require.False(t, d.Handoff(dropped), "the queue is full")

	close(sig.hold)
	requireDelivered(t, db, "o/first")
	requireDelivered(t, db, "o/queued")
	m, err := Get(ctx, db, "o", dropped.m.ID)
	require.NoError(t, err)
	require.Equal(t, StatusPending, m.Status, "left to its lease")
	require.Zero(t, sig.count("o/dropped"))
}

func TestAStoppedDispatcherWritesAPlainNotifiedMessageInsteadOfAHandoff(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	d := NewDispatcher(db, newRecordingSignaler(), DispatcherConfig{Logger: testkit.Logger(t)})
	l := listener(t, db)
	var h *Handoff
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		_, h, err = d.EnqueueForHandoff(ctx, tx, signalParams("o/plain"))
		return err
	})
	require.NoError(t, err)
	require.Nil(t, h)
	wctx, cancel := context.WithTimeout(ctx, testWait)
	defer cancel()
	_, err = l.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "any replica's dispatcher is told")
	m, err := GetByKey(ctx, db, "o", "q", "o/plain")
	require.NoError(t, err)
	require.Zero(t, m.Attempts, "not claimed: due now")
}

// slowSignaler takes d per signal and counts the signals per workflow.
type slowSignaler struct {
	mu    sync.Mutex
	calls map[string]int
	d     time.Duration
}

func (s *slowSignaler) SignalWorkflow(ctx context.Context, wf, _, _ string, _ any) error {
	s.mu.Lock()
	s.calls[wf]++
	s.mu.Unlock()
	select {
	case <-time.After(s.d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowSignaler) count(wf string) int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls[wf] }

// A handoff that waits for a send slot until its lease runs short is not
// sent by its writer: the lease could end mid-send and another dispatcher
// claim it too. It is left to the claims, and every message goes out once.
func TestAHandoffWhoseLeaseRunsShortWaitingForASendSlotIsSentOnceByAClaim(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	cfg := DispatcherConfig{SendTimeout: 300 * time.Millisecond, HandoffLease: 600 * time.Millisecond, Concurrency: 1, BatchSize: 10}
	writer := &slowSignaler{calls: map[string]int{}, d: 250 * time.Millisecond}
	other := &slowSignaler{calls: map[string]int{}, d: 10 * time.Millisecond}
	d := startDispatcher(t, db, writer, cfg)
	startDispatcher(t, db, other, cfg)
	var hs []*Handoff
	for i := range 5 {
		hs = append(hs, enqueueForHandoff(t, db, d, signalParams(fmt.Sprintf("o/h%d", i))))
	}

	for _, h := range hs {
		require.True(t, d.Handoff(h))
	}

	for i := range 5 {
		wf := fmt.Sprintf("o/h%d", i)
		requireDelivered(t, db, wf)
		require.Equal(t, 1, writer.count(wf)+other.count(wf), "%s sent once", wf)
	}
}

// Stop lets a signal in flight finish and records its outcome, instead of
// cutting it off after Temporal may have received it.
func TestStopLetsASendInFlightFinishAndRecordsIt(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	s := &slowSignaler{calls: map[string]int{}, d: 300 * time.Millisecond}
	d := NewDispatcher(db, s, DispatcherConfig{Logger: testkit.Logger(t)})
	require.NoError(t, d.Start(context.Background()))
	h := enqueueForHandoff(t, db, d, signalParams("o/inflight"))
	require.True(t, d.Handoff(h))
	require.Eventually(t, func() bool { return s.count("o/inflight") == 1 }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, d.Stop(context.Background()))

	m, err := GetByKey(context.Background(), db, "o", "q", "o/inflight")
	require.NoError(t, err)
	require.Equal(t, StatusDelivered, m.Status, "the send finished and was recorded")
	require.Equal(t, 1, s.count("o/inflight"))
}

// A handoff still waiting for room when the dispatcher stops is made due
// again at once, for any dispatcher, its unmade attempt uncounted — not
// left hidden for its lease (here an hour), which would hold a wake back
// at every rolling restart under load.
func TestStopReleasesTheHandoffsItDidNotSendToAnyDispatcher(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := newRecordingSignaler()
	sig.hold = make(chan struct{})
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: testkit.Logger(t), BatchSize: 1, Concurrency: 1, HandoffLease: time.Hour})
	require.NoError(t, d.Start(ctx))
	first := enqueueForHandoff(t, db, d, signalParams("o/first"))
	require.True(t, d.Handoff(first))
	require.Eventually(t, func() bool { return sig.count("o/first") == 1 }, testWait, testTick, "in flight, holding the one slot")
	waiting := enqueueForHandoff(t, db, d, signalParams("o/waiting"))
	require.True(t, d.Handoff(waiting), "waits in the handoff queue")
	l := listener(t, db)

	stopWhileASendIsHeld(t, d, sig)

	m, err := GetByKey(ctx, db, "o", "q", "o/waiting")
	require.NoError(t, err)
	require.Equal(t, StatusPending, m.Status)
	require.Zero(t, m.Attempts, "its attempt was never made")
	require.False(t, m.NextAttemptAt.After(time.Now()), "due now, not at the end of its lease")
	wctx, cancel := context.WithTimeout(ctx, testWait)
	defer cancel()
	_, err = l.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "the dispatchers are told")
	require.False(t, d.Handoff(&Handoff{}), "a handoff after the stop is dropped")
	require.Equal(t, 1.0, testutil.ToFloat64(d.metrics.handoffs.WithLabelValues("released")))
	requireDelivered(t, db, "o/first")
}

// A claim in flight when the dispatcher stops is finished and its messages
// sent within the stop, not cut off: a claim canceled after its commit
// reached the server would leave its messages claimed, an attempt counted,
// and unsent until their lease ended. (A test trigger makes the claim's
// update take a while, so that the stop comes in the middle of it.)
func TestStopFinishesAClaimInFlightAndSendsWhatItClaimed(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	_, err := db.Exec(ctx, `
		CREATE FUNCTION test_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$;
		CREATE TRIGGER test_slow_claim BEFORE UPDATE ON queue_messages
		FOR EACH ROW WHEN (OLD.attempts = 0 AND NEW.attempts = 1) EXECUTE FUNCTION test_slow_claim()`)
	require.NoError(t, err)
	sig := newRecordingSignaler()
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: testkit.Logger(t)})
	require.NoError(t, d.Start(ctx))
	_, _, err = Enqueue(ctx, db, signalParams("o/claimed"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var claiming bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep')`).Scan(&claiming)
		return assert.NoError(t, err) && claiming
	}, testWait, time.Millisecond, "the claim is under way")

	require.NoError(t, d.Stop(ctx))

	m, err := GetByKey(ctx, db, "o", "q", "o/claimed")
	require.NoError(t, err)
	require.Equal(t, StatusDelivered, m.Status, "claimed and sent within the stop")
	require.Equal(t, 1, sig.count("o/claimed"))
}

// Claimed messages still waiting for a send slot when the dispatcher stops
// are not sent within the stop — with Temporal slow, the rounds of sends
// they would wait for could outlast the service's stop timeout — but made
// due again at once for any dispatcher, their unmade attempt uncounted.
// The send in flight finishes and is recorded.
func TestStopReleasesClaimedSignalsStillWaitingForASendSlot(t *testing.T) {
	t.Parallel()
	db := testkit.NewPool(t)
	ctx := context.Background()
	keys := []string{"o/a", "o/b", "o/c"}
	for _, k := range keys {
		_, _, err := Enqueue(ctx, db, signalParams(k))
		require.NoError(t, err)
	}
	sig := newRecordingSignaler()
	sig.hold = make(chan struct{})
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: testkit.Logger(t), Concurrency: 1})
	require.NoError(t, d.Start(ctx))
	sends := func() (n int) {
		for _, k := range keys {
			n += sig.count(k)
		}
		return n
	}
	require.Eventually(t, func() bool {
		var claimed int
		err := db.QueryRow(ctx, `SELECT count(*) FROM queue_messages WHERE attempts = 1`).Scan(&claimed)
		return assert.NoError(t, err) && claimed == len(keys) && sends() == 1
	}, testWait, testTick, "all claimed, one in flight holding the one slot")
	l := listener(t, db)

	stopWhileASendIsHeld(t, d, sig)

	require.Equal(t, 1, sends(), "only the send in flight went out")
	require.Equal(t, 2.0, testutil.ToFloat64(d.metrics.results.WithLabelValues("released")))
	for _, k := range keys {
		if sig.count(k) == 1 {
			requireDelivered(t, db, k)
			continue
		}
		m, err := GetByKey(ctx, db, "o", "q", k)
		require.NoError(t, err)
		require.Equal(t, StatusPending, m.Status, k)
		require.Zero(t, m.Attempts, "%s: its attempt was never made", k)
		require.False(t, m.NextAttemptAt.After(time.Now()), "%s: due now, not at the end of its lease", k)
	}
	wctx, cancel := context.WithTimeout(ctx, testWait)
	defer cancel()
	_, err := l.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "the dispatchers are told")
}

// A dispatcher that lost its LISTEN connection (a Postgres restart, a
// terminated backend) backs off between reconnects, up to 5 s. A handoff
// accepted meanwhile waits in the handoff queue; if the replica is stopped
// (SIGTERM) before the dispatcher reconnects, the stop must release it as
// it releases any handoff it did not send (handoff.go, releaseHandoffs:
// "rather than left hidden, which held those wakes back by HandoffLease at
// every rolling restart") — not leave it hidden for its whole lease and
// counted nowhere.
func TestAStopWhileReconnectingReleasesTheHandoffsItHolds(t *testing.T) {
	ctx := context.Background()
	dsn := testkit.NewDatabase(t)
	writer := testkit.NewPoolFor(t, dsn)
	// The dispatcher's own pool: while down, every acquire fails, as when
	// Postgres cannot be reached.
	var down atomic.Bool
	var failed atomic.Int64
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if down.Load() {
			failed.Add(1)
			return true, errors.New("test: database unreachable")
		}
		return true, nil
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)

	sig := newRecordingSignaler()
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: testkit.Logger(t), HandoffLease: time.Hour})
	require.NoError(t, d.Start(ctx))
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	_, _, err = Enqueue(ctx, writer, signalParams("o/before"))
	require.NoError(t, err)
	requireDelivered(t, writer, "o/before") // listening

	// Its LISTEN connection is cut and it cannot reconnect for a while.
	down.Store(true)
	var pid uint32
	require.Eventually(t, func() bool {
		return writer.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+notifyChannel+`'`).Scan(&pid) == nil
	}, testWait, testTick)
	_, err = writer.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	// Five failed reconnects: it now waits 1.6 s before the next one.
	require.Eventually(t, func() bool { return failed.Load() >= 5 }, testWait, time.Millisecond)
	down.Store(false)

	// A wake committed now is handed to the (running) dispatcher…
	var h *Handoff
	err = pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
		var err error
		_, h, err = d.EnqueueForHandoff(ctx, tx, signalParams("o/handed"))
		return err
	})
	require.NoError(t, err)
	require.NotNil(t, h, "the dispatcher runs: the message is written leased to it")
	require.True(t, d.Handoff(h), "accepted into the handoff queue")

	// …and the replica is stopped before the dispatcher reconnects.
	require.NoError(t, d.Stop(ctx))

	m, err := GetByKey(ctx, writer, "o", "q", "o/handed")
	require.NoError(t, err)
	require.Zero(t, sig.count("o/handed"), "not sent by the stopped dispatcher")
	require.False(t, m.NextAttemptAt.After(time.Now().Add(time.Minute)),
		"released at the stop, due at once — not hidden until its lease ends at %s", m.NextAttemptAt)
	require.Zero(t, m.Attempts, "its attempt was never made")
	require.Equal(t, 1.0, testutil.ToFloat64(d.metrics.handoffs.WithLabelValues("released")))
}

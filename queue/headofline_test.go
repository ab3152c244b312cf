package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/reveille/reveille/internal/testkit"
)

// stuckWorkflowSignaler hangs every signal to a workflow named "o/slow…"
// until its context ends (the workflow's lock held, its shard slow: a
// Temporal fault the tests cannot cause otherwise) and takes every other
// at once.
type stuckWorkflowSignaler struct {
	stuck    chan struct{} // closed by unstick: the hung sends return
	once     sync.Once
	mu       sync.Mutex
	calls    map[string]int
	inFlight map[string]int
	peak     map[string]int
}

func newStuckWorkflowSignaler() *stuckWorkflowSignaler {
	return &stuckWorkflowSignaler{stuck: make(chan struct{}), calls: map[string]int{}, inFlight: map[string]int{}, peak: map[string]int{}}
}

func (s *stuckWorkflowSignaler) unstick() { s.once.Do(func() { close(s.stuck) }) }

func (s *stuckWorkflowSignaler) SignalWorkflow(ctx context.Context, wf, _, _ string, _ any) error {
	s.mu.Lock()
	s.calls[wf]++
	s.inFlight[wf]++
	s.peak[wf] = max(s.peak[wf], s.inFlight[wf])
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[wf]--
		s.mu.Unlock()
	}()
	if strings.HasPrefix(wf, "o/slow") {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stuck:
			return errors.New("stuck")
		}
	}
	return nil
}

func (s *stuckWorkflowSignaler) count(wf string) (calls, peak int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[wf], s.peak[wf]
}

// One workflow whose signals hang holds back no other workflow's: its
// backlog, claimed in due order, took every send slot and every claim, so
// an unrelated agent's wake waited rounds of SendTimeout behind it (up to
// 40 s at the defaults). A dispatcher now sends to one workflow at a time;
// the stuck one's next signal follows its send in flight. (The send
// timeout and the due poll are an hour here: a healthy signal delivered
// within the test's wait went by neither.)
func TestOneStuckWorkflowHoldsBackNoOtherWorkflowsSignals(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := newStuckWorkflowSignaler()
	// the defaults' proportions (batch 100, 32 in flight), scaled down
	startDispatcher(t, db, sig, DispatcherConfig{SendTimeout: time.Hour, HandoffLease: 2 * time.Hour, Concurrency: 4, BatchSize: 12})
	t.Cleanup(sig.unstick) // (before the stop, which waits for the sends)
	for i := range 12 {
		p := signalParams(fmt.Sprintf("o/slow-%d", i))
		p.Signal.WorkflowID = "o/slow"
		_, _, err := Enqueue(ctx, db, p)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { calls, _ := sig.count("o/slow"); return calls >= 1 }, testWait, testTick, "the stuck workflow's send is in flight")

	for i := range 5 {
		_, _, err := Enqueue(ctx, db, signalParams(fmt.Sprintf("o/healthy-%d", i)))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		for i := range 5 {
			m, err := GetByKey(ctx, db, "o", "q", fmt.Sprintf("o/healthy-%d", i))
			require.NoError(t, err)
			if m.Status != StatusDelivered {
				return false
			}
		}
		return true
	}, testWait, testTick, "healthy workflows' signals waited behind one stuck workflow's")
	calls, peak := sig.count("o/slow")
	require.Equal(t, 1, calls, "the stuck workflow's next signals wait for its send in flight")
	require.Equal(t, 1, peak)
}

// Two signals committed for one workflow while a send to it is in flight
// — a tool decision, then the wake — are both sent, one after the other,
// as soon as the send in flight is done: a claim passes over a busy
// workflow, and its end has the dispatcher look again at once (not at the
// next due poll). So is a retry of one that falls due while another send
// to it is in flight.
func TestSignalsToABusyWorkflowFollowItsSendInFlight(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	release, entered := make(chan struct{}), make(chan struct{}, 3)
	var mu sync.Mutex
	var order []string
	sig := signalerFunc(func(ctx context.Context, wf, _, _ string, arg any) error {
		if wf == "o/busy" {
			entered <- struct{}{}
			<-release
		}
		mu.Lock()
		order = append(order, wf)
		mu.Unlock()
		return nil
	})
	// (the due poll an hour away: what is delivered within the test's wait
	// did not wait for it)
	startDispatcher(t, db, sig, DispatcherConfig{HandoffLease: time.Hour})
	p := signalParams("first")
	p.Signal.WorkflowID = "o/busy"
	_, _, err := Enqueue(ctx, db, p)
	require.NoError(t, err)
	<-entered // its send is in flight
	for _, k := range []string{"second", "third"} {
		p := signalParams(k)
		p.Signal.WorkflowID = "o/busy"
		_, _, err := Enqueue(ctx, db, p)
		require.NoError(t, err)
	}
	_, _, err = Enqueue(ctx, db, signalParams("o/other"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 1 }, testWait, testTick, "another workflow's signal is not held")
	close(release)
	require.Eventually(t, func() bool {
		for _, k := range []string{"first", "second", "third"} {
			m, err := GetByKey(ctx, db, "o", "q", k)
			require.NoError(t, err)
			if m.Status != StatusDelivered {
				return false
			}
		}
		return true
	}, testWait, testTick, "a busy workflow's signals follow its send in flight at once")
}

// A workflow's retry that falls due while another of its signals is in
// flight is sent once that send is done, not at the next due poll (the
// wait before a look left out every message of a busy workflow, those due
// later too). Found by a review of this change.
func TestARetryOfABusyWorkflowFallingDueFollowsItsSendInFlight(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	var failedA atomic.Bool
	sig := signalerFunc(func(ctx context.Context, wf, _, _ string, arg any) error {
		var m struct{ K string }
		if err := json.Unmarshal(arg.(json.RawMessage), &m); err != nil {
			return err
		}
		if m.K == "a" {
			if !failedA.Swap(true) {
				return serviceerror.NewUnavailable("frontend hiccup")
			}
			return nil
		}
		time.Sleep(time.Second) // b: a slow send, in flight when a's retry falls due
		return nil
	})
	for _, k := range []string{"a", "b"} {
		p := signalParams("k-" + k)
		p.Signal.WorkflowID = "o/x"
		p.Payload = json.RawMessage(`{"k":"` + k + `"}`)
		_, _, err := Enqueue(ctx, db, p)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond) // (a is due first)
	}
	startDispatcher(t, db, sig, DispatcherConfig{HandoffLease: time.Hour, MinBackoff: 300 * time.Millisecond, MaxBackoff: 300 * time.Millisecond})
	require.Eventually(t, func() bool {
		m, err := GetByKey(ctx, db, "o", "q", "k-a")
		require.NoError(t, err)
		return m.Status == StatusDelivered
	}, testWait, testTick, "a retry of a busy workflow waited for the due poll")
}

// A busy workflow's message that falls due between a claim's snapshot
// (its transaction's now(), which the pass-over test uses too) and the
// next untilNextDue is neither passed over (so its send in flight ends in
// no look) nor counted by the wait (due, and its workflow busy): it waits
// for the ping or the lease poll, not for the send in flight. The wait's
// read now also names the busy workflows with due messages. Found by a
// review of this change. (The sleeps order the steps; should one come
// late, the test passes without the interleaving — it cannot fail for it.)
func TestABusyWorkflowsMessageFallingDueDuringAClaimFollowsItsSendInFlight(t *testing.T) {
	dsn := testkit.NewDatabase(t)
	db := testkit.NewPoolFor(t, dsn)
	// the dispatcher's own pool: its LISTEN connection and one more, so
	// that its claims run on a connection that has their statement cached
	pcfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	pcfg.MaxConns = 2
	dpool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(dpool.Close)
	ctx := context.Background()
	bDone := make(chan struct{})
	sig := signalerFunc(func(ctx context.Context, wf, _, _ string, arg any) error {
		var m struct{ K string }
		_ = json.Unmarshal(arg.(json.RawMessage), &m)
		if m.K == "b" {
			<-bDone // a slow send, in flight while x falls due
		}
		return nil
	})
	startDispatcher(t, dpool, sig, DispatcherConfig{HandoffLease: time.Hour})
	t.Cleanup(func() {
		select {
		case <-bDone:
		default:
			close(bDone)
		}
	})
	p := signalParams("k-b")
	p.Signal.WorkflowID = "o/w"
	p.Payload = json.RawMessage(`{"k":"b"}`)
	_, _, err = Enqueue(ctx, db, p)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // b's send is in flight: o/w is busy

	// x, for o/w, due in a second
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		x := signalParams("k-x")
		x.Signal.WorkflowID = "o/w"
		x.Payload = json.RawMessage(`{"k":"x"}`)
		m, _, err := Enqueue(ctx, tx, x)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE queue_messages SET next_attempt_at = now() + interval '1 second' WHERE id = $1`, m.ID)
		return err
	}))
	time.Sleep(400 * time.Millisecond)

	// a claim (any notification) starts before x is due and, slow (a lock
	// stands in for a loaded database), ends after
	lock, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `LOCK TABLE queue_messages IN SHARE ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `SELECT pg_notify($1, '')`, notifyChannel)
	require.NoError(t, err)
	time.Sleep(900 * time.Millisecond) // x falls due meanwhile
	require.NoError(t, lock.Commit(ctx))
	time.Sleep(300 * time.Millisecond)

	close(bDone) // b's send ends: x follows it
	require.Eventually(t, func() bool {
		m, err := GetByKey(ctx, db, "o", "q", "k-x")
		require.NoError(t, err)
		return m.Status == StatusDelivered
	}, testWait, testTick, "x waited for the ping or the lease poll, not for b's send")
}

type signalerFunc func(ctx context.Context, workflowID, runID, name string, arg any) error

func (f signalerFunc) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	return f(ctx, workflowID, runID, name, arg)
}

// A signal held behind a send to its workflow is released, not sent, once
// the dispatcher stops: sent after that send, it held the stop for another
// round of sends.
func TestAStopReleasesASignalHeldBehindASendToItsWorkflow(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	sig := newStuckWorkflowSignaler()
	d := NewDispatcher(db, sig, DispatcherConfig{Logger: testkit.Logger(t)})
	require.NoError(t, d.Start(ctx))
	first := signalParams("first")
	first.Signal.WorkflowID = "o/slow"
	_, _, err := Enqueue(ctx, db, first)
	require.NoError(t, err)
	require.Eventually(t, func() bool { calls, _ := sig.count("o/slow"); return calls == 1 }, testWait, testTick, "a send to the workflow is in flight")
	second := signalParams("second")
	second.Signal.WorkflowID = "o/slow"
	require.True(t, d.Handoff(enqueueForHandoff(t, db, d, second)))
	time.Sleep(100 * time.Millisecond) // (the handoff is taken and held; if not yet, the stop releases it all the same)

	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	require.Eventually(t, func() bool { return !d.life.Running() }, testWait, testTick)
	sig.unstick() // the send in flight ends (failed) within the stop
	require.NoError(t, <-stopped)

	calls, _ := sig.count("o/slow")
	require.Equal(t, 1, calls, "the held signal was sent within the stop")
	m, err := GetByKey(ctx, db, "o", "q", "second")
	require.NoError(t, err)
	require.Equal(t, StatusPending, m.Status)
	require.Zero(t, m.Attempts, "released: its unmade attempt is not counted")
}

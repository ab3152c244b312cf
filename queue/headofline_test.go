package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// stuckWorkflowSignaler hangs every signal to a workflow named "o/slow…"
// until its context ends (the workflow's lock held, its shard slow: a
// Temporal fault the tests cannot cause otherwise) and takes every other
// at once.
type stuckWorkflowSignaler struct {
	mu       sync.Mutex
	calls    map[string]int
	inFlight map[string]int
	peak     map[string]int
}

func newStuckWorkflowSignaler() *stuckWorkflowSignaler {
	return &stuckWorkflowSignaler{calls: map[string]int{}, inFlight: map[string]int{}, peak: map[string]int{}}
}

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
		<-ctx.Done()
		return ctx.Err()
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
// an unrelated agent's wake waited rounds of SendTimeout behind it (6 s
// here, up to 40 s at the defaults). A dispatcher now sends to one
// workflow at a time; the stuck one's next signal follows its send in
// flight.
func TestOneStuckWorkflowHoldsBackNoOtherWorkflowsSignals(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	const sendTimeout = 2 * time.Second
	sig := newStuckWorkflowSignaler()
	// the defaults' proportions (batch 100, 32 in flight), scaled down
	startDispatcher(t, db, sig, DispatcherConfig{SendTimeout: sendTimeout, Concurrency: 4, BatchSize: 12})
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
	// (well within one SendTimeout: behind the stuck sends, they waited
	// for one to time out at least)
	require.Eventually(t, func() bool {
		for i := range 5 {
			m, err := GetByKey(ctx, db, "o", "q", fmt.Sprintf("o/healthy-%d", i))
			require.NoError(t, err)
			if m.Status != StatusDelivered {
				return false
			}
		}
		return true
	}, sendTimeout/2, testTick, "healthy workflows' signals waited behind one stuck workflow's")

	// the stuck workflow's signals go one at a time, each after the last
	// timed out, and none is lost
	require.Eventually(t, func() bool { calls, _ := sig.count("o/slow"); return calls >= 2 }, testWait, testTick)
	_, peak := sig.count("o/slow")
	require.Equal(t, 1, peak, "signals in flight to one workflow at once")
}

// Two signals committed for one workflow while a send to it is in flight
// — a tool decision, then the wake — are both sent, one after the other,
// as soon as the send in flight is done: a claim passes over a busy
// workflow, and its end has the dispatcher look again at once (not at the
// next due poll).
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
	startDispatcher(t, db, sig, DispatcherConfig{})
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
	}, time.Second, testTick, "a busy workflow's signals follow its send in flight at once")
}

type signalerFunc func(ctx context.Context, workflowID, runID, name string, arg any) error

func (f signalerFunc) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	return f(ctx, workflowID, runID, name, arg)
}

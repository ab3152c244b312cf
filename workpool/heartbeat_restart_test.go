package workpool

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// heartbeatGate holds the executor's heartbeat after its query has
// read every row and before the executor acts on the answer (pgx calls
// TraceQueryEnd from rows.Close, which the last rows.Next calls).
type heartbeatGate struct {
	armed   atomic.Bool
	arrived chan struct{}
	release chan struct{}
}

func (g *heartbeatGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == sqlHeartbeat && g.armed.Load() {
		return context.WithValue(ctx, g, true)
	}
	return ctx
}

func (g *heartbeatGate) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(g) == nil || !g.armed.CompareAndSwap(true, false) {
		return
	}
	close(g.arrived)
	<-g.release
}

// A Postgres crash takes back the start of work whose handler runs here;
// the loop starts the same attempt again, handing it to this executor,
// whose run under way goes on (executor.launch). A heartbeat whose query
// read the row while it was pending, before that start, must not act on
// its stale answer and give the run up: the run given up reports nothing,
// and the launch that would have run the attempt anew was dropped — the
// row stayed running, unheartbeaten, until recovery failed an attempt
// whose handler succeeded.
func TestAHeartbeatAnsweredBeforeARestartDoesNotGiveUpTheRunThatGoesOn(t *testing.T) {
	gate := &heartbeatGate{arrived: make(chan struct{}), release: make(chan struct{})}
	db := testkit.NewTracedPool(t, gate)
	h := newHarnessOn(t, db, func(c *Config) { c.MaxWorkers = 10; c.HeartbeatTimeout = 30 * time.Second })

	var runs atomic.Int32
	started := make(chan struct{}, 4)
	finish := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(finish) }) })
	h.m.Register("test_handle", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		runs.Add(1)
		started <- struct{}{}
		<-finish // (a handler that finishes its work whatever its context says)
		return json.RawMessage(`{"ok":true}`), nil
	})
	h.m.exec.started.Store(true) // takes hand-offs, no claim loop
	h.m.exec.completer.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.m.exec.completer.Stop(ctx)
	})

	h.runMain() // the term's first iteration
	id := h.enqueue()
	h.runMain()
	select {
	case <-started:
	case <-time.After(testWait):
		t.Fatal("the handler never ran")
	}

	// The crash took the start back: the row is as before it (pending,
	// unclaimed, no attempt counted), queued in its org's queue again.
	h.exec(`UPDATE workpool_work SET state = 'pending', claimed_by = NULL, heartbeat_at = NULL WHERE id = $1`, id)
	h.exec(`INSERT INTO workpool_org_queues (pool, org_id, head_at)
		SELECT pool, org_id, run_at FROM workpool_work WHERE id = $1
		ON CONFLICT (pool, org_id) DO UPDATE SET head_at = least(workpool_org_queues.head_at, excluded.head_at)`, id)

	// A heartbeat reads the row now (pending: not this executor's) ...
	gate.armed.Store(true)
	hbDone := make(chan error, 1)
	go func() { hbDone <- h.m.exec.heartbeat() }()
	select {
	case <-gate.arrived:
	case <-time.After(testWait):
		t.Fatal("the heartbeat never ran its query")
	}
	// ... the loop starts the attempt again, for this executor, which
	// keeps the run under way ...
	h.runMain()
	var state string
	var claimed *uuid.UUID
	require.NoError(t, db.QueryRow(h.ctx, `SELECT state, claimed_by FROM workpool_work WHERE id = $1`, id).Scan(&state, &claimed))
	require.Equal(t, "running", state)
	require.NotNil(t, claimed)
	require.Equal(t, uuid.UUID(h.m.exec.id), *claimed, "the re-start handed the attempt to this executor")
	// ... and the heartbeat then acts on what it read.
	close(gate.release)
	require.NoError(t, <-hbDone)

	once.Do(func() { close(finish) }) // the handler succeeds
	deadline := time.Now().Add(5 * time.Second)
	var w workRow
	for time.Now().Before(deadline) {
		w = h.work(id)
		if w.state == "finished" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.m.exec.mu.Lock()
	_, held := h.m.exec.jobs[id]
	h.m.exec.mu.Unlock()
	t.Logf("handler runs: %d; row: %s attempts=%d outcome=%v; executor still holds it: %v", runs.Load(), w.state, w.attempts, deref(w.outcome), held)
	if w.state != "finished" {
		// Nothing will record it: recovery does, once the heartbeat timeout passes.
		h.clock.Advance(h.m.cfg.HeartbeatTimeout + h.m.cfg.RecoveryPeriod + time.Second)
		h.runMain()
		s := h.status(id)
		t.Logf("after recovery: %s %s error=%q", s.State, s.Outcome, s.Error)
	}
	require.Equal(t, "finished", w.state, "the handler succeeded, yet its result was never recorded: work %s is left running, claimed by this executor, unheartbeaten", id)
	require.Equal(t, "succeeded", deref(w.outcome))
}

// A row this executor runs that is running but unclaimed (a Postgres crash
// took back the claim, which commits without waiting for the disk) is not
// this executor's: its run is given up, and the heartbeat goes on for the
// others — it failed whole ("mine" was NULL), and the cancel of another
// attempt it carried never reached its handler.
func TestARunningUnclaimedRowDoesNotFailTheHeartbeat(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxWorkers = 10 })
	finish := make(chan struct{})
	t.Cleanup(func() { close(finish) })
	started := make(chan struct{}, 4)
	causes := make(chan error, 4)
	h.m.Register("test_handle", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
		case <-finish:
		}
		return nil, nil
	})
	h.m.exec.started.Store(true)
	h.runMain()
	a, b := h.enqueue(), h.enqueue()
	h.runMain()
	<-started
	<-started
	h.exec(`UPDATE workpool_work SET claimed_by = NULL, heartbeat_at = NULL WHERE id = $1`, b) // (its claim lost)
	h.exec(`UPDATE workpool_work SET canceled = true WHERE id = $1`, a)                        // (canceled through another replica)

	err := h.m.exec.heartbeat()
	require.NoError(t, err, "one unclaimed row fails the heartbeat of every attempt")
	var got []error
	for range 2 {
		select {
		case c := <-causes:
			got = append(got, c)
		case <-time.After(2 * time.Second):
			t.Fatalf("the handlers were told %v only", got)
		}
	}
	require.ElementsMatch(t, []error{errWorkCanceled, errLost}, got,
		"the canceled work's handler is told so; the unclaimed row's run is given up (no longer this executor's)")
}

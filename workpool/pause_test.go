package workpool

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// paths are the ways an iteration starts work: a pause must hold on each.
// The fast path shares fairly (sqlIterateFastShared) once an iteration has
// seen the work of two orgs.
var paths = []struct {
	name     string
	fullOnly bool
	otherOrg string // the second item's org
}{{"fast path", false, "org-1"}, {"fast path sharing fairly", false, "org-2"}, {"full iteration", true, "org-1"}}

func TestPause_WorkEnqueuedToAPausedPoolStartsOnlyAfterResume(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(5))
			h.l.fullOnly = p.fullOnly
			require.NoError(t, h.m.Pause(h.ctx, "default"))
			ids := []uuid.UUID{h.enqueue(), h.enqueue(withOrg(p.otherOrg))}

			for range 3 {
				h.runMain()
				h.clock.Advance(DefaultCooldown)
			}
			o := h.observe()
			require.Empty(t, o.running, "a paused pool starts nothing")
			require.ElementsMatch(t, ids, o.pending)

			require.NoError(t, h.m.Resume(h.ctx, "default"))
			h.runMain()
			require.ElementsMatch(t, ids, h.observe().running, "resumed, it starts the waiting work")
		})
	}
}

// A retry is pending work with a later run_at: a pause holds it back like
// any other start.
func TestPause_ARetryDueDuringAPauseWaitsForTheResume(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.l.fullOnly = p.fullOnly
			id := h.enqueue(withRetry(3, 100, 1))
			h.runMain()
			require.NoError(t, h.m.Pause(h.ctx, "default"))
			other := h.enqueue(withOrg(p.otherOrg))
			h.complete(id, "failed", 1)
			h.clock.Advance(time.Second) // the retry is due

			for range 2 {
				h.runMain()
			}
			require.Equal(t, "pending", h.work(id).state, "no retry while paused")
			require.Equal(t, "pending", h.work(other).state)

			require.NoError(t, h.m.Resume(h.ctx, "default"))
			h.runMain()
			w := h.work(id)
			require.Equal(t, "running", w.state)
			require.Equal(t, 1, w.attempts, "the second attempt runs")
		})
	}
}

// Pausing stops starts only: an attempt that runs finishes and its hook
// runs, and cancelations are processed, pending work's included.
func TestPause_RunningWorkFinishesAndCancelationsProceedDuringAPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.m.RegisterHook("count", recordHook)
	hookTable(t, h.db)
	running := h.enqueue(withHook("count", `{}`))
	toCancel := h.enqueue(withHook("count", `{}`))
	h.runMain()
	require.NoError(t, h.m.Pause(h.ctx, "default"))
	waiting := h.enqueue(withHook("count", `{}`))

	h.complete(running, "success", 1)
	h.cancel(toCancel)
	h.cancel(waiting)
	h.runMain()
	require.True(t, h.work(toCancel).canceled, "running work is told to stop")
	h.complete(toCancel, "success", 1) // its executor's report

	for id, want := range map[uuid.UUID]string{running: "succeeded", toCancel: "canceled", waiting: "canceled"} {
		w := h.work(id)
		require.Equal(t, "finished", w.state, "work %s", id)
		require.Equal(t, want, *w.outcome)
		n, outcome := hookCallsOf(t, h.db, id)
		require.Equal(t, 1, n, "one hook call for %s", id)
		require.Equal(t, want, outcome)
	}
}

func TestPause_APausedPoolIsNotReportedSaturatedAndDoesNotPoll(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withMaxParallelism(1))
	h.enqueue()
	h.enqueue()
	h.runMain()
	h.clock.Advance(DefaultCooldown + time.Second)
	h.runMain()
	require.Equal(t, RunStatus{Kind: "scheduled", Saturated: true, At: h.observe().runStatus.At}, h.observe().runStatus,
		"before the pause: every slot taken")

	require.NoError(t, h.m.Pause(h.ctx, "default"))
	res := h.runMain()

	st := h.observe().runStatus
	require.Equal(t, "scheduled", st.Kind, "running and pending work remain")
	require.False(t, st.Saturated, "a paused pool is not saturated")
	require.False(t, res.wakeAt.Before(h.clock.Now().Add(time.Second)), "no polling for work it may not start: %v", res.wakeAt.Sub(h.clock.Now()))
	info, err := h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.True(t, info.Paused)
	require.False(t, info.RunStatus.Saturated)
	require.True(t, h.l.startsBlocked.Load(), "enqueue kicks are dropped while paused")
}

// A paused pool starts nothing, so it never shows "running" (the contract:
// scheduled while work runs or waits, else idle): the pause itself turns a
// running status into scheduled, and the iterations of the pause — woken by
// completions, enqueues, recovery — keep what the loop last published
// rather than say "running" between their first statement and the one
// that publishes.
func TestPause_APausedPoolNeverShowsRunning(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, withMaxParallelism(5))
			h.l.fullOnly = p.fullOnly
			first := h.enqueue()
			h.enqueue(withOrg(p.otherOrg))
			h.runMain()
			require.Equal(t, "running", h.observe().runStatus.Kind, "before the pause: starting work")

			require.NoError(t, h.m.Pause(h.ctx, "default"))
			require.Equal(t, "scheduled", h.observe().runStatus.Kind, "the pause itself: its work runs")

			h.complete(first, "success", 1)
			h.enqueue()
			for range 3 {
				if !p.fullOnly {
					_, err := h.l.iterateFast(h.ctx, h.clock.Now())
					require.NoError(t, err)
					require.NotEqual(t, "running", h.observe().runStatus.Kind, "after the fast statement")
				}
				h.runMain()
				require.Equal(t, "scheduled", h.observe().runStatus.Kind, "after the iteration")
				h.clock.Advance(time.Second)
			}
		})
	}
}

// An idle paused pool still hears enqueues, so that its status comes to
// say that work waits; once it does, further enqueues need not wake it.
func TestPause_AnIdlePausedPoolPublishesIdleUntilWorkArrives(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.NoError(t, h.m.Pause(h.ctx, "default"))

	h.runMain()
	require.Equal(t, "idle", h.observe().runStatus.Kind, "no cooldown: a paused pool is not running")
	h.l.kick(kickEnqueue)
	require.Len(t, h.l.kickc, 1, "an enqueue wakes an idle paused loop")
	<-h.l.kickc

	h.enqueue()
	h.runMain()
	require.Equal(t, "scheduled", h.observe().runStatus.Kind, "work waits")
	h.l.kick(kickEnqueue)
	require.Empty(t, h.l.kickc, "more enqueues cannot start anything: no wake")
}

// The pause is the pool row's: a new process (another Manager on the same
// database) finds the pool paused and starts nothing.
func TestPause_HoldsAcrossARestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.NoError(t, h.m.Pause(h.ctx, "default"))
	id := h.enqueue()

	m2, err := New(h.db, Config{Pools: map[string]int{"default": 10}, Logger: h.m.logger, Now: h.clock.Now})
	require.NoError(t, err)
	m2.Register("test_handle", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	l2 := newLoop(m2, "default")
	require.NoError(t, l2.takeover(h.ctx))
	_, err = l2.iterate(h.ctx)
	require.NoError(t, err)

	require.Equal(t, "pending", h.work(id).state)
	info, err := m2.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.True(t, info.Paused)
}

func TestPause_IsIdempotentAndAnUnknownPoolIsNotFound(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	require.NoError(t, h.m.Pause(h.ctx, "default"))
	require.NoError(t, h.m.Pause(h.ctx, "default"))
	info, err := h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.True(t, info.Paused)
	require.NoError(t, h.m.Resume(h.ctx, "default"))
	require.NoError(t, h.m.Resume(h.ctx, "default"))
	info, err = h.m.Pool(h.ctx, "org-1", "default")
	require.NoError(t, err)
	require.False(t, info.Paused)

	require.ErrorIs(t, h.m.Pause(h.ctx, "missing"), ErrPoolNotFound)
	require.ErrorIs(t, h.m.Resume(h.ctx, "missing"), ErrPoolNotFound)
}

// With real loops and executors: a resume wakes the loop (no timer is
// set while paused), and the paused gauge follows the pool.
func TestPause_ResumeStartsWaitingWorkAtOnceOnARunningManager(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	db, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Registry: reg})
	ctx := context.Background()
	require.NoError(t, m.Pause(ctx, "default"))
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
	require.NoError(t, err)
	requireLoopSettled(t, db, m, "default", "scheduled")
	st, err := m.Status(ctx, "org-1", id)
	require.NoError(t, err)
	require.Equal(t, StatePending, st.State, "the loop saw it (it published scheduled) and did not start it")
	require.Equal(t, 1.0, gaugeValue(t, reg, "reveille_workpool_paused", "default"))

	require.NoError(t, m.Resume(ctx, "default"))

	requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	require.Equal(t, 0.0, gaugeValue(t, reg, "reveille_workpool_paused", "default"))
}

// gaugeValue reads the gauge name{pool} from reg (-1 when absent).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, pool string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.Metric {
			for _, l := range mt.Label {
				if l.GetName() == "pool" && l.GetValue() == pool {
					return mt.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// beforeStatement is a pgx tracer that calls do, once, just before the
// first statement whose SQL is sql is sent.
type beforeStatement struct {
	sql   string
	armed atomic.Pointer[func()]
}

func (b *beforeStatement) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == b.sql {
		if do := b.armed.Swap(nil); do != nil {
			(*do)()
		}
	}
	return ctx
}

func (b *beforeStatement) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An iteration publishes what it read; work enqueued after its reads must
// wake the loop again, or the loop sleeps on work it never saw (a paused
// pool has no timer: it would say "idle" until the resume, and an enqueue
// kick dropped there once made a running manager's pause test time out).
// The enqueue commits between the iteration's reads and its publishing of
// "idle", and its kick (what the listener does on its NOTIFY) arrives
// while the iteration runs.
func TestPause_WorkEnqueuedWhileAnIterationPublishesIdleWakesTheLoop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(h *harness)
	}{
		{"an idle paused pool", func(h *harness) {
			require.NoError(h.t, h.m.Pause(h.ctx, "default"))
			h.runMain()
			require.Equal(h.t, "idle", h.observe().runStatus.Kind)
		}},
		{"a paused pool whose running work just finished", func(h *harness) {
			id := h.enqueue()
			h.runMain()
			require.NoError(h.t, h.m.Pause(h.ctx, "default"))
			h.runMain()
			require.Equal(h.t, "scheduled", h.observe().runStatus.Kind, "work runs")
			h.complete(id, "success", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hook := &beforeStatement{sql: sqlSetRunStatus}
			cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
			require.NoError(t, err)
			cfg.ConnConfig.Tracer = hook
			db, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(db.Close)
			h := newHarnessOn(t, db)
			tc.prepare(h)
			select { // what the loop would have consumed already
			case <-h.l.kickc:
			default:
			}

			var late uuid.UUID
			hook.armed.Store(ptr(func() {
				// (On another connection: the iteration's transaction waits.)
				ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
				defer cancel()
				var err error
				late, err = h.m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "test_handle"})
				require.NoError(t, err)
				h.l.kick(kickEnqueue)
			}))
			h.runMain()
			require.NotEqual(t, uuid.Nil, late, "the enqueue ran during the iteration")
			require.Equal(t, "idle", h.observe().runStatus.Kind, "the iteration read the tables before the enqueue")

			require.Len(t, h.l.kickc, 1, "the enqueue's kick wakes the loop")
			<-h.l.kickc
			h.runMain()
			o := h.observe()
			require.Equal(t, "scheduled", o.runStatus.Kind, "the next iteration says that work waits")
			require.Equal(t, []uuid.UUID{late}, o.pending)
		})
	}
}

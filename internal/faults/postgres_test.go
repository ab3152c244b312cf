//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"

	"github.com/reveille/reveille/client"
)

const (
	// postgresOutage is how long Postgres stays stopped.
	postgresOutage = 5 * time.Second
	// loadGoroutines create wake-ups whose work takes loadWorkMS.
	loadGoroutines = 4
	loadWorkMS     = 300
)

// Postgres restarted under load: the replicas reconnect by themselves; the
// pool loops, the dispatchers and an SSE tail resume; no answer is a 500
// without a problem+json body; /readyz is 503 while Postgres is down and
// 200 once it is back; every wake-up that was created is woken once.
func TestPostgresRestartUnderLoad(t *testing.T) {
	e := newEnv(t)
	clients := []*client.Client{e.client(0), e.client(1)}
	e.fund(clients[0], 100_000)
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()

	// Load: wake-ups through both replicas, each for a workflow of its own,
	// paced below what the pool drains (poolLimit slots of loadWorkMS
	// each): unpaced, a fast machine created wake-ups faster than they
	// drain, and the backlog then outlasted settleWait (a red CI run).
	loadEvery := time.Duration(loadGoroutines) * loadWorkMS * time.Millisecond * 5 / (4 * poolLimit)
	var (
		mu       sync.Mutex
		runs     = map[string]tclient.WorkflowRun{}
		failures atomic.Int64
		created  atomic.Int64
		load     sync.WaitGroup
	)
	for g := range loadGoroutines {
		load.Go(func() {
			tick := time.NewTicker(loadEvery)
			defer tick.Stop()
			for i := 0; ctx.Err() == nil; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				id, run := e.park()
				mu.Lock()
				runs[id] = run
				mu.Unlock()
				if _, err := clients[(g+i)%2].Wakeups.Create(ctx, e.wakeRequest(id, loadWorkMS)); err != nil {
					failures.Add(1)
				} else {
					created.Add(1)
				}
			}
		})
	}

	// A live tail through replica b of a stream written through replica a.
	tailClient := e.client(1, client.WithReconnect(client.ReconnectPolicy{MaxBackoff: 500 * time.Millisecond}))
	_, err := clients[0].Streams.Append(ctx, "run-1", "out", []byte("chunk-0"), client.WithIdempotencyKey("chunk-0"))
	require.NoError(t, err)
	var tailed []string
	tailDone := make(chan error, 1)
	go func() {
		for ch, err := range tailClient.Streams.Tail(context.Background(), "run-1", "out", client.TailParams{IdleTimeout: 3 * time.Second}) {
			if err != nil {
				tailDone <- err
				return
			}
			tailed = append(tailed, string(ch.Data))
		}
		tailDone <- nil
	}()
	var appended atomic.Int64
	appended.Store(1)
	var appender sync.WaitGroup
	appender.Go(func() {
		for ctx.Err() == nil {
			data := fmt.Sprintf("chunk-%d", appended.Load())
			// The same key until it lands: a retry never appends twice.
			if _, err := clients[0].Streams.Append(context.Background(), "run-1", "out", []byte(data), client.WithIdempotencyKey(data)); err == nil {
				appended.Add(1)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	// /readyz of both replicas, sampled throughout.
	type sample struct {
		at     time.Time
		status int
		ctype  string
	}
	var samples []sample
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for ctx.Err() == nil {
			for _, r := range e.replicas {
				status, _, ctype := r.readyz()
				mu.Lock()
				samples = append(samples, sample{time.Now(), status, ctype})
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	time.Sleep(3 * time.Second) // load before the fault
	// Work that runs through the whole outage and past the heartbeat
	// timeout (its executor cannot heartbeat meanwhile): it must keep its
	// one attempt, not be recovered as silent once Postgres is back. (One
	// item: it holds one of the pool's poolLimit slots throughout, and the
	// load's backlog must still drain within settleWait.)
	longID, longRun := e.park()
	mu.Lock()
	runs[longID] = longRun
	mu.Unlock()
	longWakeup, err := clients[0].Wakeups.Create(ctx, e.wakeRequest(longID, int(postgresOutage/time.Millisecond)+4000))
	require.NoError(t, err)
	long := []string{longWakeup.ID}
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM wakeups u JOIN workpool_work w ON w.id = u.work_id AND w.org_id = u.org_id
			WHERE u.id = ANY($1::uuid[]) AND w.state = 'running' AND w.claimed_by IS NOT NULL`, long) == int64(len(long))
	}, 30*time.Second, 20*time.Millisecond, "the long work runs before the fault")
	t.Cleanup(func() {
		if !pgStack.up() {
			require.NoError(t, pgStack.start())
		}
	})
	pgStack.stop()
	down := time.Now()
	for _, r := range e.replicas {
		require.Eventually(t, func() bool { status, _, _ := r.readyz(); return status == http.StatusServiceUnavailable },
			10*time.Second, 50*time.Millisecond, "%s is unready without Postgres", r.name)
	}
	time.Sleep(time.Until(down.Add(postgresOutage)))
	upCalled := time.Now()
	require.NoError(t, pgStack.start())
	for _, r := range e.replicas {
		require.Eventually(t, func() bool { status, _, _ := r.readyz(); return status == http.StatusOK },
			60*time.Second, 50*time.Millisecond, "%s is ready again by itself", r.name)
	}
	before := created.Load()
	appendedBefore := appended.Load()
	require.Eventually(t, func() bool { return created.Load() >= before+8 }, 60*time.Second, 50*time.Millisecond,
		"wake-ups are created again after the restart")
	time.Sleep(2 * time.Second) // load after the fault
	stopLoad()
	load.Wait()
	appender.Wait()
	sampler.Wait()
	require.Greater(t, appended.Load(), appendedBefore, "appends resume")

	// The tail follows every chunk, in order, once, across the outage.
	require.NoError(t, clients[0].Streams.Close(context.Background(), "run-1", "out", client.WithIdempotencyKey("close")))
	select {
	case err := <-tailDone:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("the tail did not end after the stream closed")
	}
	want := make([]string, appended.Load())
	for i := range want {
		want[i] = fmt.Sprintf("chunk-%d", i)
	}
	require.Equal(t, want, tailed, "the SSE tail resumed after the restart and saw every chunk once")

	// /readyz told the truth: never 200 while Postgres was down, and
	// every 503 a problem.
	for _, s := range samples {
		if s.at.After(down) && s.at.Before(upCalled) {
			require.NotEqual(t, http.StatusOK, s.status, "ready at %s while Postgres was down", s.at)
		}
		if s.status == http.StatusServiceUnavailable {
			require.Equal(t, "application/problem+json", s.ctype)
		}
	}

	// Every wake-up that exists was woken once; workflows whose create
	// never committed are not waited for.
	rows, err := e.db.Query(context.Background(), `SELECT id::text, workflow_id FROM wakeups WHERE org_id = $1`, org)
	require.NoError(t, err)
	var ws []parked
	for rows.Next() {
		var w parked
		require.NoError(t, rows.Scan(&w.wakeupID, &w.workflowID))
		w.run = runs[w.workflowID]
		ws = append(ws, w)
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, int64(len(ws)), created.Load())
	e.requireWoken(ws)
	// The outage outlasted the heartbeat timeout, but no executor lost an
	// attempt to recovery: silence counts only within the leader's term,
	// and the outage ended the terms (every item's one attempt stood, the
	// long one's included).
	require.Zero(t, e.count(`SELECT count(*) FROM workpool_work WHERE pool = 'wakeup' AND attempts > 1`),
		"attempts recovered as silent although their executors were only cut off from Postgres")
	require.EqualValues(t, len(long), e.count(`SELECT count(*) FROM wakeups WHERE id = ANY($1::uuid[]) AND outcome = 'succeeded'`, long))
	total, fivexx := e.responses.requireNoBare5xx(t)
	t.Logf("wake-ups %d (create calls failed: %d), answers %d (5xx: %d, each a problem), chunks %d, readyz samples %d",
		len(ws), failures.Load(), total, fivexx, appended.Load(), len(samples))
}

package workpool

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMetrics_CountFinishedWorkAndReadQueueDepthPerPool(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}, Registry: reg})
	ids := make([]EnqueueParams, 3)
	for i := range ids {
		ids[i] = EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"}
	}
	done, err := m.EnqueueMany(context.Background(), ids)
	require.NoError(t, err)
	for _, id := range done {
		requireFinished(t, m, "org-1", id, OutcomeSucceeded)
	}
	_, err = m.Enqueue(context.Background(), EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop",
		RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return counterValue(t, m.metrics.succeeded.WithLabelValues("default")) == 3
	}, testWait, testTick, "completions are counted once the loop has processed them")
	require.Equal(t, 3.0, counterValue(t, m.metrics.started.WithLabelValues("default")))
	require.Zero(t, counterValue(t, m.metrics.failed.WithLabelValues("default")))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, name := range []string{"reveille_workpool_pending", "reveille_workpool_running", "reveille_workpool_oldest_pending_age_seconds",
		"reveille_workpool_loop_iteration_seconds", "reveille_workpool_start_lag_seconds", "reveille_workpool_started_total"} {
		require.True(t, names[name], "metric %s is exposed", name)
	}
	pending := -1.0
	for _, mf := range mfs {
		if mf.GetName() != "reveille_workpool_pending" {
			continue
		}
		for _, mt := range mf.Metric {
			for _, l := range mt.Label {
				if l.GetName() == "pool" && l.GetValue() == "default" {
					pending = mt.GetGauge().GetValue()
				}
			}
		}
	}
	require.Equal(t, 1.0, pending, "the scheduled item waits")
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// /metrics is unauthenticated, and counting a big backlog is not free: a
// burst of scrapes shares one depth read, and a scrape after depthMaxAge
// reads again.
func TestMetrics_ABurstOfScrapesReadsTheDepthOnce(t *testing.T) {
	ctx := context.Background()
	rt := &testkit.RoundTrips{}
	db := testkit.NewTracedPool(t, rt)
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	m, err := New(db, Config{Pools: map[string]int{"default": 5}, Registry: reg, Logger: testkit.Logger(t), Now: clock.Now})
	require.NoError(t, err)
	m.Register("noop", func(context.Context, Job) (json.RawMessage, error) { return nil, nil })
	enqueue := func(n int) {
		for range n {
			_, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "noop"})
			require.NoError(t, err)
		}
	}
	depthReads := func() (n int) {
		for _, sent := range rt.Take() {
			if strings.HasPrefix(sent, "SELECT p.name, p.paused") {
				n++
			}
		}
		return n
	}
	scrape := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "reveille_workpool_pending" {
				return mf.Metric[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no reveille_workpool_pending")
		return 0
	}
	enqueue(3)
	depthReads()

	var wg sync.WaitGroup
	got := make([]float64, 20)
	for i := range got {
		wg.Go(func() { got[i] = scrape() })
	}
	wg.Wait()
	for _, v := range got {
		require.Equal(t, 3.0, v)
	}
	require.Equal(t, 1, depthReads(), "twenty scrapes at once, one read")

	enqueue(2)
	clock.Advance(depthMaxAge / 2)
	require.Equal(t, 3.0, scrape(), "within depthMaxAge, the last read")
	clock.Advance(depthMaxAge)
	require.Equal(t, 5.0, scrape(), "past it, a new one")
	require.Equal(t, 1, depthReads())
}

// A depth read that fails — a database too slow to answer within the
// read's timeout — is shared as a good one is: scrapes at once waited for
// each other's timeouts one after the other (k × 2 s for the k-th), and
// every other metric of /metrics with them.
func TestMetrics_ScrapesDuringASlowDatabaseShareOneFailedRead(t *testing.T) {
	ctx := context.Background()
	rt := &testkit.RoundTrips{}
	db := testkit.NewTracedPool(t, rt)
	reg := prometheus.NewRegistry()
	_, err := New(db, Config{Pools: map[string]int{"default": 5}, Registry: reg, Logger: testkit.Logger(t), Now: newFakeClock().Now})
	require.NoError(t, err)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE workpool_pools IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	rt.Take()

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = reg.Gather() })
	}
	wg.Wait()
	reads := 0
	for _, sent := range rt.Take() {
		if strings.HasPrefix(sent, "SELECT p.name, p.paused") {
			reads++
		}
	}
	require.Equal(t, 1, reads, "four scrapes at once, one read that timed out")
}

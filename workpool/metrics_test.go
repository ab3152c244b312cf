package workpool

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
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

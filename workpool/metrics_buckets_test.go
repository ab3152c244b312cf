package workpool

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// topBucket is the highest finite upper bound of histogram h.
func topBucket(t *testing.T, h prometheus.Observer) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, h.(prometheus.Metric).Write(&out))
	b := out.GetHistogram().GetBucket()
	return b[len(b)-1].GetUpperBound()
}

// The histograms show the waits an operator is told to expect in a
// finite bucket: an iteration and a report run hooks for up to the hook
// timeout, and a paused or saturated pool's backlog waits hours to start.
func TestMetricsBucketsReachTheWaitsTheyMeasure(t *testing.T) {
	m := benchManagerWith(t, Config{Pools: map[string]int{"default": 5}, Registry: prometheus.NewRegistry()})
	for name, tc := range map[string]struct {
		h     prometheus.Observer
		least time.Duration
	}{
		"loop iteration (hooks)": {m.metrics.iteration.WithLabelValues("default"), DefaultHookTimeout},
		"report (hooks)":         {m.metrics.reportSeconds, DefaultHookTimeout},
		"start lag (a backlog)":  {m.metrics.startLag.WithLabelValues("default"), 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			require.GreaterOrEqual(t, topBucket(t, tc.h), tc.least.Seconds())
		})
	}
}

package mandates

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/leader"
)

// metrics are labelled by outcome only: agent ids would make the series
// unbounded.
type metrics struct {
	spends    *prometheus.CounterVec
	resolved  *prometheus.CounterVec
	expired   prometheus.Counter
	batch     prometheus.Histogram
	sweepErrs prometheus.Counter // the expiry sweeper's failures
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		spends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_mandates_spends_total",
			Help: "Spend decisions by result (ok, refused); replays of an idempotency key are not counted.",
		}, []string{"result"}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_mandates_approvals_resolved_total",
			Help: "Approval requests resolved, by final state (approved, denied, expired, canceled).",
		}, []string{"state"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_mandates_approvals_expired_total",
			Help: "Approval requests expired by the sweeper (or on an attempt to resolve them late).",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "reveille_mandates_spend_batch_size",
			Help:    "Spends decided per shared commit.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		sweepErrs: leader.NewTaskErrors(SweeperLeadership),
	}
	for _, r := range []string{"ok", "refused"} {
		m.spends.WithLabelValues(r)
	}
	for _, s := range []string{StateApproved, StateDenied, StateExpired, StateCanceled} {
		m.resolved.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.spends, m.resolved, m.expired, m.batch, m.sweepErrs)
	}
	return m
}

func (m *metrics) spend(ok bool) {
	if ok {
		m.spends.WithLabelValues("ok").Inc()
	} else {
		m.spends.WithLabelValues("refused").Inc()
	}
}

func (m *metrics) resolve(state string) {
	m.resolved.WithLabelValues(state).Inc()
	if state == StateExpired {
		m.expired.Inc()
	}
}

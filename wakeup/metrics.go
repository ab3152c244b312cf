package wakeup

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	created    *prometheus.CounterVec
	resolved   *prometheus.CounterVec
	reconciled prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_wakeups_created_total", Help: "Wake-ups created, by gate result: funded or refused.",
		}, []string{"gate"}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_wakeups_resolved_total", Help: "Wake-ups resolved, by outcome.",
		}, []string{"outcome"}),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_wakeups_reconciled_total", Help: "Funded wake-ups the reconciler enqueued or settled after a failure between the two transactions.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.created, m.resolved, m.reconciled)
	}
	return m
}

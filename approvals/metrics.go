package approvals

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/internal/leader"
)

// metrics are labelled by source and decision only: agent, session and
// tool names would make the series unbounded.
type metrics struct {
	decisions *prometheus.CounterVec
	requests  prometheus.Counter
	latency   *prometheus.HistogramVec
	sweepErrs prometheus.Counter // the expiry sweeper's failures
}

func newMetrics(db *pgxpool.Pool, reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reveille_approvals_decisions_total",
			Help: "Tool calls decided, by source (policy, human, expired) and decision (approved, denied).",
		}, []string{"source", "decision"}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "reveille_approvals_pending_requests_total",
			Help: "Tool calls that no policy decided, left pending for a human.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "reveille_approvals_time_to_decision_seconds",
			Help:    "From a pending tool call's request to its decision, by source (human, expired).",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 22), // 0.5 s … ~12 days: a call may wait 7 days (MaxExpiresIn)
		}, []string{"source"}),
		sweepErrs: leader.NewTaskErrors(SweeperLeadership),
	}
	// Every series is there from the start, at 0: an alert on a rate or on
	// an absent series needs it before the first event.
	for _, src := range []string{SourceHuman, SourceExpired} {
		m.latency.WithLabelValues(src)
	}
	for _, src := range []string{SourcePolicy, SourceHuman, SourceExpired} {
		for _, d := range []string{DecisionApproved, DecisionDenied} {
			if src != SourceExpired || d == DecisionDenied {
				m.decisions.WithLabelValues(src, d)
			}
		}
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.requests, m.latency, m.sweepErrs, &pendingGauge{db: db, desc: prometheus.NewDesc(
			"reveille_approvals_pending",
			"Tool calls pending now, all orgs (read from the database at scrape time, so every replica reports the same).",
			nil, nil)})
	}
	return m
}

func (m *metrics) decided(source, status string) {
	m.decisions.WithLabelValues(source, status).Inc()
}

func (m *metrics) requested() { m.requests.Inc() }

func (m *metrics) resolved(source, decision string, waited time.Duration) {
	m.decisions.WithLabelValues(source, decision).Inc()
	m.latency.WithLabelValues(source).Observe(waited.Seconds())
}

// pendingGauge counts pending requests in the database when scraped: a
// counter kept in memory would drift across replicas (one creates, another
// resolves).
type pendingGauge struct {
	db   *pgxpool.Pool
	desc *prometheus.Desc
}

func (g *pendingGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *pendingGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var n int64
	if err := g.db.QueryRow(ctx, qCountPending).Scan(&n); err != nil {
		return // left out of this scrape rather than failing all of /metrics
	}
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n))
}

package workpool

import (
	"context"
	"sync"
	"time"
)

// poolReport counts what this replica did in one pool — the reference's
// report: work it finished by outcome, retries it scheduled. It feeds the
// counters in metrics.go and the minute log, which prints and resets the
// "since" copy.
type poolReport struct {
	m    *Manager
	pool string

	mu                                                   sync.Mutex
	completed, succeeded, failed, retries, canceled      int64
	sCompleted, sSucceeded, sFailed, sRetries, sCanceled int64
}

// report returns pool's report on this replica.
func (m *Manager) report(pool string) *poolReport {
	m.reportsMu.Lock()
	defer m.reportsMu.Unlock()
	r, ok := m.reports[pool]
	if !ok {
		r = &poolReport{m: m, pool: pool}
		m.reports[pool] = r
	}
	return r
}

// finished counts one item finished with outcome o.
func (r *poolReport) finished(o Outcome) {
	met := r.m.metrics
	r.mu.Lock()
	defer r.mu.Unlock()
	r.completed++
	r.sCompleted++
	switch o {
	case OutcomeSucceeded:
		r.succeeded++
		r.sSucceeded++
		met.succeeded.WithLabelValues(r.pool).Inc()
	case OutcomeFailed:
		r.failed++
		r.sFailed++
		met.failed.WithLabelValues(r.pool).Inc()
	case OutcomeCanceled:
		r.canceled++
		r.sCanceled++
		met.canceled.WithLabelValues(r.pool).Inc()
	}
}

// retried counts n failed attempts scheduled for another attempt.
func (r *poolReport) retried(n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries += n
	r.sRetries += n
	r.m.metrics.retried.WithLabelValues(r.pool).Add(float64(n))
}

// logReports logs every pool's report once a minute until ctx ends.
func (m *Manager) logReports(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.reportsMu.Lock()
		reports := make([]*poolReport, 0, len(m.reports))
		for _, r := range m.reports {
			reports = append(reports, r)
		}
		m.reportsMu.Unlock()
		for _, r := range reports {
			r.log()
		}
	}
}

func (r *poolReport) log() {
	r.mu.Lock()
	c, s, f, rt, cn := r.sCompleted, r.sSucceeded, r.sFailed, r.sRetries, r.sCanceled
	r.sCompleted, r.sSucceeded, r.sFailed, r.sRetries, r.sCanceled = 0, 0, 0, 0, 0
	r.mu.Unlock()
	if c+rt == 0 {
		return
	}
	r.m.logger.Info("pool report", "pool", r.pool, "completed", c, "succeeded", s, "failed", f, "retries", rt, "canceled", cn)
}

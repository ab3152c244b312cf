package workpool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are labelled by pool only (never by org or work id). Counters
// count on the replica where the event happened; the gauges are read from
// the database at scrape time, so every replica reports the same values.
type metrics struct {
	started, succeeded, failed, retried, canceled *prometheus.CounterVec
	hookCalls                                     *prometheus.CounterVec
	hookRetries                                   *prometheus.CounterVec
	// refused is labelled by pool only: an org label would let tenants
	// grow the series without bound.
	refused *prometheus.CounterVec
	// queueRepairs counts org queues the leader's repair had to write:
	// work that was pending without its queue (docs/workpool.md § "Org
	// queues"). Anything but 0 outside a rolling upgrade is a bug.
	queueRepairs *prometheus.CounterVec
	// errors counts the failures this replica's loops, executor and
	// completer logged and will retry, by stage (errorStages): each is a
	// WARN line too, and a rate above 0 for minutes is the database (or a
	// bug) failing the pool.
	errors    *prometheus.CounterVec
	iteration *prometheus.HistogramVec
	startLag  *prometheus.HistogramVec
	// fairPlans counts planned fair starts (plan.go) by whether the
	// loop's view held: a pool whose plans mostly miss starts on the near
	// pick, after a backoff.
	fairPlans *prometheus.CounterVec
	// Executor-side batching (this replica, all pools).
	claimBatch, reportBatch     prometheus.Histogram
	claimSeconds, reportSeconds prometheus.Histogram
	depth                       *depthCollector
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reveille_workpool_" + name, Help: help}, []string{"pool"})
	}
	// Durations of one iteration, claim or report: past a second, up to a
	// minute — an iteration and a report run hooks, each up to
	// REVEILLE_HOOK_TIMEOUT (10 s by default).
	durations := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1, 2.5, 5, 10, 30, 60}
	mt := &metrics{
		started:   counter("started_total", "Attempts started by the pool's loop."),
		succeeded: counter("succeeded_total", "Work finished with outcome succeeded."),
		failed:    counter("failed_total", "Work finished with outcome failed."),
		retried:   counter("retried_total", "Failed attempts scheduled for another attempt."),
		canceled:  counter("canceled_total", "Work finished with outcome canceled."),
		hookCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reveille_workpool_hook_calls_total",
			Help: "onComplete hook calls by result (ok, failed)."}, []string{"pool", "result"}),
		hookRetries: counter("hook_retries_total", "Retried onComplete hook calls: calls made again after a failed one."),
		refused: counter("enqueue_refused_total",
			"Work items refused at enqueue because their org reached its cap of unfinished work in the pool (REVEILLE_ORG_MAX_PENDING)."),
		queueRepairs: counter("queue_repairs_total",
			"Org queues the leader's repair wrote: orgs whose pending work had no queue row, or a head after it (0 but during a rolling upgrade from a version before the queues)."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reveille_workpool_errors_total",
			Help: "Failures logged and retried, by stage: loop (an iteration or the start of a term; the loop stands down and leads again), chore (a leader's chore: retention, repair), claim, heartbeat (or the executor's announcement), record (an attempt's result), pools (listing the pools to run loops for)."},
			[]string{"stage"}),
		iteration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "reveille_workpool_loop_iteration_seconds",
			Help:    "Duration of one main loop iteration.",
			Buckets: durations}, []string{"pool"}),
		fairPlans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reveille_workpool_fair_plans_total",
			Help: "Planned fair starts by result: held (the loop's view of the pool held: the start went ahead from it), recounted (the view missed only completions not yet handed over, took the slots held from the start's snapshot and planned again), missed (it did not hold: the near pick started instead)."},
			[]string{"pool", "result"}),
		startLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "reveille_workpool_start_lag_seconds",
			Help: "Delay from a work item's run_at to its start.",
			// (to a day: a saturated or paused pool's backlog waits hours)
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 60, 300, 1800, 3600, 4 * 3600, 24 * 3600}}, []string{"pool"}),
	}
	mt.depth = &depthCollector{m: m}
	sizes := []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}
	mt.claimBatch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "reveille_workpool_claim_batch_size",
		Help: "Attempts claimed by one claim statement.", Buckets: sizes})
	mt.reportBatch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "reveille_workpool_report_batch_size",
		Help: "Attempt results committed by one report transaction.", Buckets: sizes})
	mt.claimSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "reveille_workpool_claim_seconds",
		Help: "Duration of one claim.", Buckets: durations})
	mt.reportSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "reveille_workpool_report_seconds",
		Help: "Duration of one report transaction (hooks included).", Buckets: durations})
	for _, stage := range errorStages {
		mt.errors.WithLabelValues(stage) // (at 0 from the start: alerts need the series)
	}
	if reg == nil {
		return mt, nil
	}
	for _, c := range []prometheus.Collector{mt.started, mt.succeeded, mt.failed, mt.retried, mt.canceled, mt.errors,
		mt.hookCalls, mt.hookRetries, mt.refused, mt.queueRepairs, mt.iteration, mt.fairPlans, mt.startLag, mt.claimBatch, mt.reportBatch, mt.claimSeconds,
		mt.reportSeconds, mt.depth} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("workpool metrics: %w", err)
		}
	}
	return mt, nil
}

// The stages of reveille_workpool_errors_total.
const (
	stageLoop      = "loop"
	stageChore     = "chore"
	stageClaim     = "claim"
	stageHeartbeat = "heartbeat"
	stageRecord    = "record"
	stagePools     = "pools" // listing the pools to run loops for
)

var errorStages = []string{stageLoop, stageChore, stageClaim, stageHeartbeat, stageRecord, stagePools}

// failedAt counts a failure of stage (reveille_workpool_errors_total).
func (mt *metrics) failedAt(stage string) { mt.errors.WithLabelValues(stage).Inc() }

// forPool makes the pool's series, at 0, as soon as this replica knows the
// pool: an alert on a rate or on an absent series (enqueue refusals, queue
// repairs, hook retries: 0 in steady state) needs them before the first
// event. Pools are few, made by the operator, never by tenants.
func (mt *metrics) forPool(pool string) {
	for _, c := range []*prometheus.CounterVec{mt.started, mt.succeeded, mt.failed, mt.retried, mt.canceled,
		mt.hookRetries, mt.refused, mt.queueRepairs} {
		c.WithLabelValues(pool)
	}
	for _, result := range []string{hookResult(false), hookResult(true)} {
		mt.hookCalls.WithLabelValues(pool, result)
	}
	for _, result := range []string{"held", "recounted", "missed"} {
		mt.fairPlans.WithLabelValues(pool, result)
	}
	mt.iteration.WithLabelValues(pool)
	mt.startLag.WithLabelValues(pool)
}

// depthCollector reads queue depth per pool when scraped, at most once
// per depthMaxAge: /metrics is unauthenticated, and a count of a big
// backlog is not free, so a burst of scrapes — or anyone's loop — shares
// one read instead of making the database count once per scrape. (The
// oldest item's age is taken at each scrape from the time read.)
type depthCollector struct {
	m *Manager

	mu     sync.Mutex // held through a read: scrapes meanwhile wait for it
	readAt time.Time  // when the last read ended (zero: never, or forgotten)
	pools  []poolDepth
	failed bool // the last read failed: scrapes until depthMaxAge share that too
}

// depthMaxAge is how long a depth read serves scrapes.
const depthMaxAge = time.Second

type poolDepth struct {
	pool             string
	paused           bool
	pending, running int64
	oldest           *time.Time
}

var (
	pendingDesc = prometheus.NewDesc("reveille_workpool_pending", "Work waiting to start (ready or not).", []string{"pool"}, nil)
	runningDesc = prometheus.NewDesc("reveille_workpool_running", "Slots in use.", []string{"pool"}, nil)
	oldestDesc  = prometheus.NewDesc("reveille_workpool_oldest_pending_age_seconds",
		"Age of the oldest ready work item that has not started.", []string{"pool"}, nil)
	pausedDesc = prometheus.NewDesc("reveille_workpool_paused", "1 while the pool is paused (it starts nothing), else 0.",
		[]string{"pool"}, nil)
)

const sqlDepth = `
SELECT p.name, p.paused,
  (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.state = 'pending' AND w.concurrency_key IS NULL)
  + (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.state = 'pending' AND w.concurrency_key IS NOT NULL),
  (SELECT count(*) FROM workpool_work w WHERE w.pool = p.name AND w.state = 'running'),
  least(
    (SELECT min(run_at) FROM workpool_work w WHERE w.pool = p.name AND w.state = 'pending' AND w.concurrency_key IS NULL),
    (SELECT min(run_at) FROM workpool_work w WHERE w.pool = p.name AND w.state = 'pending' AND w.concurrency_key IS NOT NULL))
FROM workpool_pools p ORDER BY p.name`

func (d *depthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- runningDesc
	ch <- oldestDesc
	ch <- pausedDesc
}

// ageSeconds is how long ago t was at now, in seconds (0 when t is not
// before now). Not now.Sub: a Duration stops at ~292 years, and a run_at
// may be as old as year 0000.
func ageSeconds(now, t time.Time) float64 {
	if !t.Before(now) {
		return 0
	}
	return float64(now.Unix()-t.Unix()) + float64(now.Nanosecond()-t.Nanosecond())/1e9
}

func (d *depthCollector) Collect(ch chan<- prometheus.Metric) {
	pools, now, ok := d.read()
	if !ok {
		return
	}
	for _, p := range pools {
		age := 0.0
		if p.oldest != nil {
			age = ageSeconds(now, *p.oldest)
		}
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(p.pending), p.pool)
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(p.running), p.pool)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, p.pool)
		pausedValue := 0.0
		if p.paused {
			pausedValue = 1
		}
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, pausedValue, p.pool)
	}
}

// forget drops the last read: the next scrape reads again.
func (d *depthCollector) forget() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.readAt = time.Time{}
}

// read returns the pools' depth as read within depthMaxAge of now, reading
// it again when older; ok is false when that read failed (logged). A
// failed read is shared as a good one is: scrapes waiting on a slow
// database would otherwise each wait out their own timeout, one after the
// other.
func (d *depthCollector) read() (pools []poolDepth, now time.Time, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now = d.m.now() // (after the lock: the read a scrape waited for counts)
	if !d.readAt.IsZero() && now.Sub(d.readAt) < depthMaxAge && !now.Before(d.readAt) {
		return d.pools, now, !d.failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := d.m.db.Query(ctx, sqlDepth)
	if err == nil {
		pools, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (p poolDepth, err error) {
			err = r.Scan(&p.pool, &p.paused, &p.pending, &p.running, &p.oldest)
			return p, err
		})
	}
	d.pools, d.readAt, d.failed = pools, d.m.now(), err != nil
	if err != nil {
		d.m.logger.Warn("reading pool depth for metrics failed", "error", err.Error())
		return nil, now, false
	}
	return pools, now, true
}

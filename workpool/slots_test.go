package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// Slot accounting under a randomized mix (issue 12): successes, retryable
// and final failures, panics, cancelations before and during a run, an
// executor crash and a graceful leader change, on replicas sharing one
// database. Whatever happens, the running count never exceeds the pool's
// limit — measured in the handlers and in the database — and comes back to
// zero, and every item ends with exactly one outcome, the one its handler's
// plan and the faults it met explain, and exactly one committed hook call.
//
// The mix is drawn from a seed that is logged; REVEILLE_TEST_SEED replays
// it (the interleaving with real time differs from run to run).
func TestSlotAccounting_ARandomMixWithCrashesCancelsAndLeaderChangesStaysWithinTheLimitAndEndsEachItemOnce(t *testing.T) {
	t.Parallel()
	const (
		n     = 300
		limit = 7
		waves = 3
	)
	seed := slotsSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	// Short timings: recovery of the crashed replica's attempts and the
	// takeovers happen within the run.
	s := newSlotRun(t, planSlotItems(rng, n), Config{Pools: map[string]int{"default": limit},
		HeartbeatTimeout: 2 * time.Second, RecoveryPeriod: 200 * time.Millisecond,
		LeaderRetry: 100 * time.Millisecond, StopGrace: 300 * time.Millisecond})
	s.startReplica()
	s.startReplica()
	s.requireLeader()

	chaos, stopChaos := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stopChaos(); wg.Wait() }) // also when the test fails midway
	samples := s.sampleRunning(chaos, &wg)
	wg.Add(1)
	go func() { defer wg.Done(); s.cancelWhenRunning(chaos, &wg) }()

	// Three waves; in the first a replica crashes and a fresh one replaces
	// it, in the second the leader stops gracefully and a fresh one replaces
	// it. Each fault comes once a random share of the wave's sure
	// invocations (items nobody cancels run at least once) ran, and while
	// the replica it hits holds an attempt in its handler.
	for w := range waves {
		lo, hi := w*n/waves, (w+1)*n/waves
		base := s.invocations.Load()
		s.enqueueWave(rng, lo, hi)
		s.cancelAtRandomMoments(chaos, &wg, lo, hi)
		sure := int64(0)
		for i := lo; i < hi; i++ {
			if s.items[i].cancelAfter == 0 && !s.items[i].cancelWhileRunning {
				sure++
			}
		}
		at := base + sure/4 + rng.Int64N(max(sure/2, 1))
		require.Eventually(t, func() bool { return s.invocations.Load() >= at }, time.Minute, testTick,
			"wave %d never reached %d invocations (seed %d)", w, at, seed)
		switch w {
		case 0:
			s.crashHolder(rng)
			s.startReplica()
		case 1:
			s.stopLeader()
			s.startReplica()
			s.requireLeader()
		}
	}

	s.waitAllFinished(seed)
	stopChaos()
	wg.Wait()

	peak, live := s.gauge.result()
	t.Logf("seed %d: peak handlers %d, peak running rows %d over %d samples, %d invocations, replica %d crashed, replica %d stopped",
		seed, peak, samples.peak.Load(), samples.count.Load(), s.invocations.Load(), s.crashed, s.stopped)
	require.Positive(t, peak)
	require.LessOrEqual(t, peak, limit, "handlers of live replicas running at once (seed %d)", seed)
	require.Zero(t, live, "handlers still running")
	require.Positive(t, samples.count.Load(), "the running count was sampled")
	require.Zero(t, samples.errors.Load(), "sampling the running count failed")
	require.LessOrEqual(t, samples.peak.Load(), int64(limit), "running rows sampled from the database (seed %d)", seed)
	var running, pending int
	require.NoError(t, s.db.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state = 'pending')
		FROM workpool_work WHERE pool = 'default'`).Scan(&running, &pending))
	require.Zero(t, running, "slots in use at the end")
	require.Zero(t, pending, "work left pending")
	require.Empty(t, s.check(), "items whose end the mix does not explain (seed %d)", seed)
}

// waitAllFinished waits for every item to finish, or fails listing those
// that did not.
func (s *slotRun) waitAllFinished(seed uint64) {
	t := s.t
	t.Helper()
	finished := func() bool {
		var done int
		err := s.db.QueryRow(context.Background(),
			`SELECT count(*) FROM workpool_work WHERE pool = 'default' AND state = 'finished'`).Scan(&done)
		return err == nil && done == len(s.items)
	}
	if assert.Eventually(t, finished, time.Minute, 20*time.Millisecond, "not every item finished (seed %d)", seed) {
		return
	}
	rows, err := s.db.Query(context.Background(), `SELECT id, state, attempts, canceled, claimed_by IS NOT NULL, run_at
		FROM workpool_work WHERE pool = 'default' AND state <> 'finished' ORDER BY id LIMIT 20`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			id                uuid.UUID
			state             string
			attempts          int
			canceled, claimed bool
			runAt             time.Time
		)
		require.NoError(t, rows.Scan(&id, &state, &attempts, &canceled, &claimed, &runAt))
		t.Logf("unfinished: %s %s attempts %d canceled %v claimed %v run_at %s", id, state, attempts, canceled, claimed, runAt)
	}
	require.NoError(t, rows.Err())
	t.FailNow()
}

// slotsSeed returns REVEILLE_TEST_SEED, or a fresh seed; either is logged.
func slotsSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("REVEILLE_TEST_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "REVEILLE_TEST_SEED")
	}
	t.Logf("seed %d (replay the mix with REVEILLE_TEST_SEED=%d)", seed, seed)
	return seed
}

// attemptPlan is what a handler does on one attempt.
type attemptPlan int

const (
	planSucceed     attemptPlan = iota
	planFail                    // a retryable error
	planFailFinal               // a NonRetryable error
	planPanic                   // retried like an error
	planAwaitCancel             // blocks until its context ends
)

// slotItem is one work item of the mix and what the test does with it.
type slotItem struct {
	org   string
	retry *RetryPolicy // nil: one attempt
	plans []attemptPlan
	work  time.Duration // how long each attempt works before its plan
	// cancelAfter > 0: the test cancels the item this long after its wave
	// was enqueued, whatever it is doing by then.
	cancelAfter time.Duration
	// notBefore: its run_at is an hour away, so the cancelation always
	// comes before any start.
	notBefore bool
	// cancelWhileRunning: every attempt awaits cancelation; the test cancels
	// the item once it sees an attempt running.
	cancelWhileRunning bool
}

func (p attemptPlan) String() string {
	return [...]string{"succeed", "fail", "fail-final", "panic", "await-cancel"}[p]
}

func (it slotItem) maxAttempts() int { return len(it.plans) }

// awaitCap bounds planAwaitCancel: past it the attempt fails, and the item
// is reported as never canceled.
const awaitCap = 20 * time.Second

func planSlotItems(rng *rand.Rand, n int) []slotItem {
	items := make([]slotItem, n)
	for i := range items {
		it := slotItem{org: fmt.Sprintf("org-%d", 1+rng.IntN(3)), work: time.Duration(rng.IntN(6)) * time.Millisecond}
		attempts := 1
		if rng.IntN(4) > 0 {
			attempts = 1 + rng.IntN(4)
			it.retry = &RetryPolicy{MaxAttempts: attempts, InitialBackoffMS: 5 + rng.IntN(20), Base: 1 + rng.Float64()}
		}
		it.plans = make([]attemptPlan, attempts)
		switch r := rng.IntN(100); {
		case r < 7:
			it.notBefore = true
			it.cancelAfter = time.Millisecond + time.Duration(rng.IntN(400))*time.Millisecond
		case r < 14:
			it.cancelWhileRunning = true
			for a := range it.plans {
				it.plans[a] = planAwaitCancel
			}
		case r < 26:
			it.cancelAfter = time.Millisecond + time.Duration(rng.IntN(400))*time.Millisecond
		}
		if !it.cancelWhileRunning {
			for a := range it.plans {
				switch r := rng.IntN(100); {
				case r < 45:
					it.plans[a] = planSucceed
				case r < 75:
					it.plans[a] = planFail
				case r < 87:
					it.plans[a] = planFailFinal
				default:
					it.plans[a] = planPanic
				}
			}
		}
		items[i] = it
	}
	return items
}

// invocation is one call of a handler: cause is what ended its context
// before it did what its plan says (nil: it did); held, whether it was
// held for a fault.
type invocation struct {
	item, attempt, replica int
	held                   bool
	cause                  error
}

// slotReplica is one Manager of the run, numbered in start order.
type slotReplica struct {
	idx int
	m   *Manager
}

// slotRun is the state of one randomized run.
type slotRun struct {
	t     *testing.T
	db    *pgxpool.Pool
	cfg   Config
	items []slotItem

	idsMu sync.Mutex  // held while a wave is enqueued, so a cancel waits for its id
	ids   []uuid.UUID // by item

	gauge       handlerGauge
	invocations atomic.Int64 // handler calls so far
	awaiting    chan int     // items whose planAwaitCancel attempt is running

	mu       sync.Mutex
	live     []*slotReplica
	started  int
	crashed  int                   // the crashed replica's idx (-1: none)
	stopped  int                   // the gracefully stopped replica's idx (-1: none)
	holds    map[int]chan struct{} // replicas whose new handlers wait for this to close (or their context)
	held     map[int]int           // handlers waiting in a hold, by replica
	log      []invocation
	canceled map[int]bool // items the test asked to cancel
}

// newSlotRun prepares a run of items on a fresh database with a hook
// table; its replicas all take cfg.
func newSlotRun(t *testing.T, items []slotItem, cfg Config) *slotRun {
	s := &slotRun{t: t, cfg: cfg, items: items, ids: make([]uuid.UUID, len(items)), awaiting: make(chan int, 4*len(items)),
		crashed: -1, stopped: -1, canceled: map[int]bool{}, holds: map[int]chan struct{}{}, held: map[int]int{}}
	s.gauge.running, s.gauge.dead = map[int]int{}, map[int]bool{}
	s.db = testkit.NewPool(t)
	hookTable(t, s.db)
	return s
}

// handlerGauge counts running handlers per replica. A crashed replica's
// handlers stop counting the moment it crashes: a crash stands for a killed
// process, whose handlers are gone, but in this test process they may take
// a moment to return after their contexts end — and recovery, after the
// heartbeat timeout, may by then rerun their work elsewhere. Their slots
// stay held in the database until that recovery, so the database sample
// below covers them.
type handlerGauge struct {
	mu               sync.Mutex
	running          map[int]int
	dead             map[int]bool
	liveCount, peakN int
}

func (g *handlerGauge) enter(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[r]++
	if !g.dead[r] {
		g.liveCount++
		g.peakN = max(g.peakN, g.liveCount)
	}
}

func (g *handlerGauge) leave(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[r]--
	if !g.dead[r] {
		g.liveCount--
	}
}

func (g *handlerGauge) kill(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dead[r] = true
	g.liveCount -= g.running[r]
}

func (g *handlerGauge) result() (peak, live int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peakN, g.liveCount
}

// startReplica runs another Manager on the run's database, its handler and
// hook registered before it starts.
func (s *slotRun) startReplica() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	idx := s.started
	s.started++
	s.mu.Unlock()
	m, err := New(s.db, liveConfig(t, s.cfg))
	require.NoError(t, err)
	m.Register("mix", s.handler(idx))
	m.RegisterHook("record", recordHook)
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Stop(ctx)
	})
	s.mu.Lock()
	s.live = append(s.live, &slotReplica{idx: idx, m: m})
	s.mu.Unlock()
}

// api returns a live replica to enqueue and cancel through.
func (s *slotRun) api() *Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[0].m
}

func (s *slotRun) managers() []*Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ms []*Manager
	for _, r := range s.live {
		ms = append(ms, r.m)
	}
	return ms
}

// remove takes the live replica at position i out of the run.
func (s *slotRun) remove(i int) *slotReplica {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live[i]
	s.live = slices.Delete(s.live, i, i+1)
	return r
}

func (s *slotRun) requireLeader() {
	s.t.Helper()
	require.Eventually(s.t, func() bool { return leaderOf(s.managers()...) != nil }, testWait, testTick,
		"no live replica took the lead")
}

// hold makes the new handlers of the replicas idxs wait, so that a fault
// is sure to catch an attempt running there.
func (s *slotRun) hold(idxs ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range idxs {
		s.holds[r] = make(chan struct{})
	}
}

// release lets the held handlers of replica r go on.
func (s *slotRun) release(r int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.holds[r]; ok {
		close(c)
		delete(s.holds, r)
	}
}

// holders lists the replicas with a handler waiting in a hold.
func (s *slotRun) holders() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs []int
	for r, n := range s.held {
		if n > 0 && s.holds[r] != nil {
			rs = append(rs, r)
		}
	}
	slices.Sort(rs)
	return rs
}

// crashHolder kills, like a killed process, a live replica that holds an
// attempt in its handler (chosen at random among those that do), and
// releases the others.
func (s *slotRun) crashHolder(rng *rand.Rand) {
	t := s.t
	t.Helper()
	all := s.liveIdxs()
	s.hold(all...)
	require.Eventually(t, func() bool { return len(s.holders()) > 0 }, testWait, testTick, "no replica ran a handler")
	holders := s.holders()
	victim := holders[rng.IntN(len(holders))]
	s.mu.Lock()
	i := slices.IndexFunc(s.live, func(r *slotReplica) bool { return r.idx == victim })
	s.crashed = victim
	s.mu.Unlock()
	r := s.remove(i)
	s.gauge.kill(r.idx)
	r.m.crash()
	for _, idx := range all {
		s.release(idx)
	}
}

func (s *slotRun) liveIdxs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var idxs []int
	for _, r := range s.live {
		idxs = append(idxs, r.idx)
	}
	return idxs
}

// stopLeader shuts the leading replica down gracefully once it holds an
// attempt in its handler: that handler outlives StopGrace, so its work is
// handed back.
func (s *slotRun) stopLeader() {
	t := s.t
	t.Helper()
	s.requireLeader()
	lead := leaderOf(s.managers()...)
	require.NotNil(t, lead)
	s.mu.Lock()
	i := slices.IndexFunc(s.live, func(r *slotReplica) bool { return r.m == lead })
	idx := -1
	if i >= 0 {
		idx = s.live[i].idx
	}
	s.mu.Unlock()
	require.GreaterOrEqual(t, i, 0)
	s.hold(idx)
	require.Eventually(t, func() bool { return slices.Contains(s.holders(), idx) }, testWait, testTick,
		"the leader ran no handler")
	s.mu.Lock()
	s.stopped = idx
	s.mu.Unlock()
	s.remove(i)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, lead.Stop(ctx), "graceful stop of the leader")
	s.release(idx)
}

func (s *slotRun) enqueueWave(rng *rand.Rand, lo, hi int) {
	t := s.t
	t.Helper()
	ps := make([]EnqueueParams, 0, hi-lo)
	for i := lo; i < hi; i++ {
		it := s.items[i]
		p := EnqueueParams{OrgID: it.org, Pool: "default", Handler: "mix", Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
			Retry: it.retry, OnComplete: &OnComplete{Hook: "record"}}
		if it.notBefore {
			p.RunAt = time.Now().Add(time.Hour)
		}
		ps = append(ps, p)
	}
	// In a few batches, through whichever live replica.
	s.idsMu.Lock()
	defer s.idsMu.Unlock()
	for len(ps) > 0 {
		k := min(len(ps), 1+rng.IntN(40))
		ids, err := s.api().EnqueueMany(context.Background(), ps[:k])
		require.NoError(t, err)
		copy(s.ids[lo:], ids)
		lo += k
		ps = ps[k:]
	}
}

func (s *slotRun) cancel(i int) {
	s.mu.Lock()
	s.canceled[i] = true
	s.mu.Unlock()
	s.idsMu.Lock()
	id := s.ids[i]
	s.idsMu.Unlock()
	assert.NoError(s.t, s.api().Cancel(context.Background(), s.items[i].org, id), "cancel item %d", i)
}

// cancelAtRandomMoments cancels the wave's items that have a cancelAfter.
func (s *slotRun) cancelAtRandomMoments(ctx context.Context, wg *sync.WaitGroup, lo, hi int) {
	for i := lo; i < hi; i++ {
		if s.items[i].cancelAfter == 0 {
			continue
		}
		after := s.items[i].cancelAfter
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sleepCtx(ctx, after) {
				s.cancel(i)
			}
		}()
	}
}

// cancelWhenRunning cancels each cancelWhileRunning item when its first
// attempt is seen running.
func (s *slotRun) cancelWhenRunning(ctx context.Context, wg *sync.WaitGroup) {
	seen := map[int]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case i := <-s.awaiting:
			if seen[i] {
				continue
			}
			seen[i] = true
			wg.Add(1)
			go func() { defer wg.Done(); s.cancel(i) }()
		}
	}
}

// handler is the mix's handler on replica r: it does what the item's plan
// says for this attempt, after working a little (or, for
// planAwaitCancel, until its context ends).
func (s *slotRun) handler(r int) Handler {
	return func(ctx context.Context, j Job) (json.RawMessage, error) {
		var args struct {
			I int `json:"i"`
		}
		if err := json.Unmarshal(j.Args, &args); err != nil {
			return nil, NonRetryable(err)
		}
		s.gauge.enter(r)
		defer s.gauge.leave(r)
		s.invocations.Add(1)
		it := s.items[args.I]
		if j.Attempt < 1 || j.Attempt > it.maxAttempts() {
			s.note(invocation{item: args.I, attempt: j.Attempt, replica: r})
			return nil, NonRetryable(fmt.Errorf("attempt %d is past the item's %d attempts", j.Attempt, it.maxAttempts()))
		}
		held := s.waitInHold(ctx, r)
		plan := it.plans[j.Attempt-1]
		wait := it.work
		if plan == planAwaitCancel {
			wait = awaitCap
			select {
			case s.awaiting <- args.I:
			case <-ctx.Done():
			}
		}
		var cause error
		if !sleepCtx(ctx, wait) {
			cause = context.Cause(ctx)
		}
		s.note(invocation{item: args.I, attempt: j.Attempt, replica: r, held: held, cause: cause})
		if cause != nil {
			return nil, ctx.Err()
		}
		switch plan {
		case planSucceed:
			return slotResult(args.I, j.Attempt), nil
		case planFail:
			return nil, errors.New(slotError(args.I, j.Attempt, plan))
		case planPanic:
			panic(fmt.Sprintf("planned panic of item %d attempt %d", args.I, j.Attempt))
		}
		return nil, NonRetryable(errors.New(slotError(args.I, j.Attempt, plan)))
	}
}

// waitInHold waits while replica r is held (or until ctx ends), and says
// whether it waited.
func (s *slotRun) waitInHold(ctx context.Context, r int) bool {
	s.mu.Lock()
	release := s.holds[r]
	if release != nil {
		s.held[r]++
	}
	s.mu.Unlock()
	if release == nil {
		return false
	}
	select {
	case <-release:
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.held[r]--
	s.mu.Unlock()
	return true
}

func (s *slotRun) note(inv invocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, inv)
}

func slotResult(i, attempt int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"i":%d,"attempt":%d}`, i, attempt))
}

// slotError is the error an attempt's plan records.
func slotError(i, attempt int, plan attemptPlan) string {
	switch plan {
	case planPanic:
		return fmt.Sprintf(`handler "mix" panicked: planned panic of item %d attempt %d`, i, attempt)
	case planAwaitCancel:
		return fmt.Sprintf("item %d attempt %d was never canceled", i, attempt)
	}
	return fmt.Sprintf("planned failure of item %d attempt %d", i, attempt)
}

// recoveryErrors are what recovery records for an attempt it takes from a
// silent executor.
var recoveryErrors = []string{
	"the executor running this attempt stopped heartbeating",
	"no executor claimed this attempt in time",
}

// runningSamples is what sampling the database's running count saw.
type runningSamples struct{ count, errors, peak atomic.Int64 }

// sampleRunning samples the database's running count until ctx ends.
func (s *slotRun) sampleRunning(ctx context.Context, wg *sync.WaitGroup) *runningSamples {
	out := &runningSamples{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sleepCtx(ctx, time.Millisecond) {
			var used int64
			err := s.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE pool = 'default' AND state = 'running'`).Scan(&used)
			switch {
			case err != nil && ctx.Err() == nil:
				out.errors.Add(1)
			case err == nil:
				out.count.Add(1)
				if used > out.peak.Load() {
					out.peak.Store(used)
				}
			}
		}
	}()
	return out
}

// slotRow is an item's end as the database has it.
type slotRow struct {
	id        uuid.UUID
	state     string
	outcome   *string
	attempts  int
	canceled  bool
	errText   *string
	result    []byte
	hookState *string
	calls     int
	hooked    *string // the outcome the hook saw
}

// check compares every item's end with what its plan, its cancelation and
// the faults it met explain, and returns what it cannot explain.
func (s *slotRun) check() []string {
	t := s.t
	t.Helper()
	rows, err := s.db.Query(context.Background(), `
		SELECT w.id, w.state, w.outcome, w.attempts, w.canceled, w.error, w.result::text, w.hook_state,
		  coalesce(h.calls, 0), h.outcome
		FROM workpool_work w LEFT JOIN hook_calls h ON h.work_id = w.id WHERE w.pool = 'default'`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slotRow, error) {
		var w slotRow
		var result *string
		err := r.Scan(&w.id, &w.state, &w.outcome, &w.attempts, &w.canceled, &w.errText, &result, &w.hookState, &w.calls, &w.hooked)
		if result != nil {
			w.result = []byte(*result)
		}
		return w, err
	})
	require.NoError(t, err)
	byID := map[uuid.UUID]slotRow{}
	for _, w := range got {
		byID[w.id] = w
	}
	require.Len(t, byID, len(s.items))
	s.mu.Lock()
	defer s.mu.Unlock()
	invs := map[int][]invocation{}
	for _, inv := range s.log {
		invs[inv.item] = append(invs[inv.item], inv)
	}
	outcomes := map[string]int{}
	faults := map[string]int{}
	for _, inv := range s.log {
		switch {
		case !inv.held || !errors.Is(inv.cause, errStopping):
		case inv.replica == s.crashed:
			faults["cut short by the crash"]++
		case inv.replica == s.stopped:
			faults["handed back at the stop"]++
		}
	}
	defer func() { t.Logf("outcomes %v; held attempts %v", outcomes, faults) }()
	var problems []string
	for i, it := range s.items {
		w, ok := byID[s.ids[i]]
		if !ok {
			problems = append(problems, fmt.Sprintf("item %d: no row", i))
			continue
		}
		outcomes[deref(w.outcome)]++
		if p := s.explain(i, it, w, invs[i]); p != "" {
			problems = append(problems, fmt.Sprintf("item %d (%s, plans %v, max %d, cancel requested %v): %s; row: state %s outcome %s attempts %d canceled %v error %q; invocations %v",
				i, s.ids[i], it.plans, it.maxAttempts(), s.canceled[i], p, w.state, deref(w.outcome), w.attempts, w.canceled, deref(w.errText), invs[i]))
		}
	}
	return problems
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// explain says what is wrong with item i's end w, or "".
func (s *slotRun) explain(i int, it slotItem, w slotRow, invs []invocation) string {
	switch {
	case w.state != "finished" || w.outcome == nil:
		return "not finished with an outcome"
	case w.calls != 1:
		return fmt.Sprintf("%d committed hook calls", w.calls)
	case deref(w.hooked) != *w.outcome:
		return fmt.Sprintf("the hook saw %s", deref(w.hooked))
	case deref(w.hookState) != "done":
		return fmt.Sprintf("hook state %s", deref(w.hookState))
	case w.canceled != (*w.outcome == string(OutcomeCanceled)):
		return "the canceled flag disagrees with the outcome"
	}
	for _, inv := range invs {
		if inv.attempt < 1 || inv.attempt > it.maxAttempts() {
			return fmt.Sprintf("attempt %d ran", inv.attempt)
		}
		if p := s.explainFault(inv, w, invs); p != "" {
			return p
		}
	}
	if *w.outcome == string(OutcomeCanceled) {
		switch {
		case !s.canceled[i]:
			return "canceled, but nobody canceled it"
		case it.notBefore && (w.attempts != 0 || len(invs) > 0):
			return "canceled before its run_at, but it ran"
		}
		return ""
	}
	for _, inv := range invs {
		if errors.Is(inv.cause, errWorkCanceled) {
			return "its running handler was canceled, but it did not end canceled"
		}
	}
	if it.notBefore {
		return "canceled before its run_at, but it did not end canceled"
	}
	a := w.attempts
	if a < 1 || a > it.maxAttempts() {
		return fmt.Sprintf("%d attempts of %d", a, it.maxAttempts())
	}
	// An attempt follows its plan when its handler did what the plan says
	// on a replica that did not crash; an attempt on the crashed replica
	// (or that never ran: claimed by it, or by nobody in time) may instead
	// have been recovered as a retryable failure.
	follows := func(attempt int) (must, may bool) {
		for _, inv := range invs {
			if inv.attempt == attempt && inv.cause == nil {
				may = true
				must = must || inv.replica != s.crashed
			}
		}
		return must, may
	}
	for j := 1; j < a; j++ {
		must, _ := follows(j)
		if p := it.plans[j-1]; must && p != planFail && p != planPanic {
			return fmt.Sprintf("attempt %d ran its plan %s, yet attempt %d followed", j, p, j+1)
		}
	}
	must, may := follows(a)
	last := it.plans[a-1]
	recovered := !must && a == it.maxAttempts() && slices.Contains(recoveryErrors, deref(w.errText))
	switch *w.outcome {
	case string(OutcomeSucceeded):
		switch {
		case last != planSucceed || !may:
			return "succeeded, but its last attempt's plan is not to"
		case string(w.result) == "" || !jsonEqual(w.result, slotResult(i, a)):
			return fmt.Sprintf("succeeded with result %s", w.result)
		}
		return ""
	case string(OutcomeFailed):
		if it.cancelWhileRunning {
			if recovered {
				return ""
			}
			return "never canceled"
		}
		final := last == planFailFinal || ((last == planFail || last == planPanic) && a == it.maxAttempts())
		if (may && final && deref(w.errText) == slotError(i, a, last)) || recovered {
			return ""
		}
		return "failed, but neither its plan nor a recovery explains the error"
	}
	return "unknown outcome"
}

// explainFault checks what the faults did to an attempt held for them: the
// crash counts it as a failed attempt (recovery records it); the graceful
// stop hands it back uncounted, so the same attempt runs again elsewhere
// unless a cancelation ended the item first.
func (s *slotRun) explainFault(inv invocation, w slotRow, invs []invocation) string {
	if !inv.held || !errors.Is(inv.cause, errStopping) {
		return ""
	}
	ranAgain := slices.ContainsFunc(invs, func(again invocation) bool {
		return again.attempt == inv.attempt && again.replica != inv.replica
	})
	switch inv.replica {
	case s.crashed:
		if w.attempts < inv.attempt || ranAgain {
			return fmt.Sprintf("attempt %d, cut short by the crash, did not count", inv.attempt)
		}
	case s.stopped:
		if !ranAgain && *w.outcome != string(OutcomeCanceled) {
			return fmt.Sprintf("attempt %d, handed back at the graceful stop, never ran again", inv.attempt)
		}
	}
	return ""
}

func (inv invocation) String() string {
	how := "did its plan"
	if inv.cause != nil {
		how = "ended by " + inv.cause.Error()
	}
	if inv.held {
		how = "held, " + how
	}
	return fmt.Sprintf("attempt %d on replica %d: %s", inv.attempt, inv.replica, how)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

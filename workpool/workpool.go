// Package workpool runs work in named, bounded, retrying, cancelable pools
// on Postgres, and calls an onComplete hook in the transaction that finishes
// each item — the Convex workpool's loop (SPEC §3), ported to Postgres facts.
//
// The life of one attempt, file by file (the table is in docs/workpool.md):
//
//   - enqueue.go: work is written pending.
//   - lead.go, iteration.go, fast.go: every pool has one main loop across
//     all replicas, run by whichever replica holds the pool's leadership (an
//     advisory lock); a generation number in the pool row fences every
//     iteration, so a stale leader writes nothing. An iteration processes
//     cancelations, recovers attempts whose executor went silent, and starts
//     ready work into the free slots — a slot is a running attempt, nothing
//     else — handing this replica's executor its share in the same statement.
//   - executor.go: executors on every replica claim the rest with SKIP
//     LOCKED, heartbeat it and run the registered handler.
//   - completer.go: the replica that ran an attempt records its result in
//     one statement that frees the slot and decides the next state (finished,
//     or pending again at its retry time), and runs the onComplete hook
//     (hooks.go) in the same transaction; then it wakes the loop.
//
// Nothing polls: enqueue, completion and cancel send NOTIFY (or kick the
// local loop directly), and timers are set only for future run_at, recovery
// and hook retries.
package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/reveille/reveille/internal/startstop"
)

// Manager owns the pools' loops, this replica's executors and the API to
// enqueue, inspect and cancel work.
type Manager struct {
	db      *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	now     func() time.Time
	metrics *metrics

	mu       sync.RWMutex
	handlers map[string]Handler
	checks   map[string]ArgsCheck
	hooks    map[string]Hook

	exec     *executor
	listener *listener
	origin   string // tags this replica's notifications, which it handles directly

	life    startstop.Base
	drained sync.Once
	wg      sync.WaitGroup // the listener, the loops' candidates and the chores

	loopsMu sync.Mutex
	loops   map[string]*loop // pools whose elector runs on this replica

	peersMu sync.Mutex
	peers   map[string]time.Time // other replicas' executors, by origin, last heard

	refusals   refusalLog // orgs this replica counted over their pending caps
	admits     admitLog   // the room this replica's pending checks last counted
	knownPools knownPools // pools found to exist, for Check

	reportsMu sync.Mutex
	reports   map[string]*poolReport // what this replica did, per pool
}

// sawPeer records another replica's executor announcing itself.
func (m *Manager) sawPeer(origin string) {
	if origin == "" {
		return
	}
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	m.peers[origin] = time.Now()
}

// livePeers counts other replicas' executors heard from within the
// heartbeat timeout.
func (m *Manager) livePeers() int {
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	n := 0
	for origin, at := range m.peers {
		if time.Since(at) > m.cfg.HeartbeatTimeout {
			delete(m.peers, origin)
			continue
		}
		n++
	}
	return n
}

// New builds a Manager and creates the configured pools that do not exist
// yet. Register handlers and hooks, then Start.
func New(db *pgxpool.Pool, cfg Config) (*Manager, error) {
	if db == nil {
		return nil, errors.New("workpool: nil database pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Manager{
		db:       db,
		cfg:      cfg,
		logger:   cfg.Logger.With("component", "workpool"),
		now:      cfg.Now,
		handlers: map[string]Handler{},
		checks:   map[string]ArgsCheck{},
		hooks:    map[string]Hook{},
		loops:    map[string]*loop{},
		peers:    map[string]time.Time{},
		reports:  map[string]*poolReport{},
	}
	var err error
	if m.metrics, err = newMetrics(cfg.Registry, m); err != nil {
		return nil, err
	}
	m.exec = newExecutor(m)
	m.origin = m.exec.id.String()[24:]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.ensurePools(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// Register makes handler name runnable on this replica. Registering a name
// twice replaces it. Work of that handler already started and waiting for
// an executor is claimed at once.
func (m *Manager) Register(name string, h Handler) {
	m.mu.Lock()
	m.handlers[name] = h
	m.mu.Unlock()
	m.exec.kick()
}

// ArgsCheck checks a handler's arguments when its work is enqueued, so that
// work that could never run is refused — with every problem named, a 400
// over REST — before anything is written (a wake-up's spend included). It
// reports each problem with report(field, detail), field named inside the
// arguments ("url"; "" for the arguments as a whole). It must not do I/O:
// it runs on every enqueue, before the transaction.
type ArgsCheck func(args json.RawMessage, report func(field, detail string))

// RegisterArgsCheck makes check judge the arguments of handler name's work
// at enqueue (Enqueue, EnqueueMany, EnqueueTx and Check).
func (m *Manager) RegisterArgsCheck(name string, check ArgsCheck) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks[name] = check
}

func (m *Manager) argsCheck(name string) (ArgsCheck, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	c, ok := m.checks[name]
	return c, ok
}

// RegisterHook makes an onComplete hook available under name.
func (m *Manager) RegisterHook(name string, h Hook) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hooks[name] = h
}

func (m *Manager) handler(name string) (Handler, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h, ok := m.handlers[name]
	return h, ok
}

func (m *Manager) hook(name string) (Hook, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	h, ok := m.hooks[name]
	return h, ok
}

// HasHandler reports whether a handler is registered under name.
func (m *Manager) HasHandler(name string) bool {
	_, ok := m.handler(name)
	return ok
}

func (m *Manager) handlerNames() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	names := make([]string, 0, len(m.handlers))
	for n := range m.handlers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Start runs this replica's part: it listens for notifications first (so
// nothing committed after this point goes unnoticed), then starts the
// executors and a leadership candidate for every pool's loop. It returns
// once all of that is running; it runs until Stop (Start's ctx only bounds
// the start).
func (m *Manager) Start(ctx context.Context) error {
	return m.life.StartWith(context.WithoutCancel(ctx), "workpool", func(ctx context.Context) (func(context.Context), error) {
		l, err := newListener(ctx, m)
		if err != nil {
			return nil, err
		}
		m.listener = l
		m.goRun(func() { l.run(ctx) })
		m.exec.start()
		if err := m.syncLoops(ctx); err != nil {
			m.metrics.failedAt(stagePools)
			m.logger.Warn("listing pools failed; will retry", "error", err.Error())
		}
		m.goRun(func() { m.watchPools(ctx) })
		m.goRun(func() { m.logReports(ctx) })
		// Once stopped, the loops hand their leadership over and the
		// listener closes; Stop then drains the executor.
		return func(ctx context.Context) { <-ctx.Done(); m.wg.Wait() }, nil
	})
}

func (m *Manager) goRun(f func()) {
	m.wg.Add(1)
	go func() { defer m.wg.Done(); f() }()
}

// Stop shuts this replica's part down in stages (the shutdown rows of
// docs/workpool.md's lifecycle table): the loops hand their leadership
// over, the executor stops claiming, running handlers get StopGrace (at
// most three quarters of what ctx allows) to finish, then their contexts
// are canceled and their work handed back; every result is recorded.
// Stopping twice, or before Start, is safe.
func (m *Manager) Stop(ctx context.Context) error {
	if !m.exec.started.Load() {
		return nil // never started: nothing to stop, and Start stays possible
	}
	// The loops first: a leader whose executor no longer claims would start
	// work nobody here runs.
	stopErr := m.life.Stop(ctx)
	m.exec.stopClaiming()
	// Drained even when the loops were slow to stop: handlers are canceled
	// and their work handed back with whatever time ctx leaves, rather than
	// left running until the heartbeat timeout.
	var err error
	m.drained.Do(func() { err = m.exec.drain(ctx) })
	return errors.Join(stopErr, err)
}

// syncLoops runs a leadership candidate for every pool in the database.
func (m *Manager) syncLoops(ctx context.Context) error {
	names, err := m.poolNames(ctx)
	if err != nil {
		return err
	}
	m.loopsMu.Lock()
	defer m.loopsMu.Unlock()
	for _, name := range names {
		if _, ok := m.loops[name]; ok {
			continue
		}
		m.metrics.forPool(name)
		l := newLoop(m, name)
		m.loops[name] = l
		m.goRun(func() { l.campaign(ctx) })
	}
	return nil
}

// watchPools picks up pools created by other replicas.
func (m *Manager) watchPools(ctx context.Context) {
	t := time.NewTicker(m.cfg.RecoveryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.syncLoops(ctx); err != nil && ctx.Err() == nil {
				m.metrics.failedAt(stagePools)
				m.logger.Warn("listing pools failed", "error", err.Error())
			}
		}
	}
}

func (m *Manager) loopFor(pool string) *loop {
	m.loopsMu.Lock()
	defer m.loopsMu.Unlock()
	return m.loops[pool]
}

// kickLoop wakes pool's loop if this replica runs its candidate.
func (m *Manager) kickLoop(pool string, kind int) {
	if l := m.loopFor(pool); l != nil {
		l.kick(kind)
	}
}

// kickAll wakes every local loop and the executor (after the listener lost
// notifications).
func (m *Manager) kickAll() {
	m.loopsMu.Lock()
	for _, l := range m.loops {
		l.kick(kickWork)
	}
	m.loopsMu.Unlock()
	m.exec.kick()
}

func newID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only if the system's randomness does; nothing sane
		// can go on without it.
		panic(fmt.Sprintf("workpool: uuid: %v", err))
	}
	return id
}

package inbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/listen"
	"github.com/reveille/reveille/internal/startstop"
)

// ErrStopped: the log's hub is not running (starting or stopping), so no
// live subscription can be had.
var ErrStopped = errors.New("inbox: the approvals event hub is not running")

// Hub fans the notifications of one LISTEN connection out to this
// process's subscribers, as the streams hub does for run streams: a
// notification carries only the org and seq, and a woken subscriber reads
// what is new from the table. Signals coalesce in a one-slot channel, so a
// slow reader holds up neither writers nor other readers. When the
// connection fails the hub reconnects and wakes every subscriber, since
// notifications sent meanwhile are lost.
type Hub struct {
	db     *pgxpool.Pool
	logger *slog.Logger
	life   startstop.Base

	mu   sync.Mutex
	subs map[string]map[*Subscription]struct{} // by org
}

// How long the LISTEN connection may stay silent before it is pinged, and
// how long the ping may take.
const (
	hubPingEvery   = 30 * time.Second
	hubPingTimeout = 10 * time.Second
)

func newHub(db *pgxpool.Pool, logger *slog.Logger) *Hub {
	return &Hub{db: db, logger: logger, subs: map[string]map[*Subscription]struct{}{}}
}

// Start connects and LISTENs, and returns once notifications flow.
func (h *Hub) Start(ctx context.Context) error {
	return h.life.StartWith(ctx, "approvals event hub", func(ctx context.Context) (func(context.Context), error) {
		loop := listen.Loop{DB: h.db, Channel: notifyChannel, Name: "approvals event hub", Logger: h.logger,
			PingEvery: hubPingEvery, PingTimeout: hubPingTimeout, Notify: h.dispatch, Reconnected: h.wakeAll}
		conn, err := loop.Connect(ctx)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) { loop.Run(ctx, conn) }, nil
	})
}

// Stop closes the LISTEN connection and ends every subscription.
func (h *Hub) Stop(ctx context.Context) error { return h.life.Stop(ctx) }

// dispatch wakes the subscribers of the org a "<seq>/<org>" names.
func (h *Hub) dispatch(payload string) {
	_, org, ok := strings.Cut(payload, "/")
	if !ok {
		h.logger.Warn("approvals event hub: malformed notification", "payload", payload)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[org] {
		sub.signal()
	}
}

func (h *Hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range h.subs {
		for sub := range subs {
			sub.signal()
		}
	}
}

// Subscribe registers interest in the org's new events; see Log.Subscribe.
func (h *Hub) Subscribe(orgID string) (*Subscription, error) {
	// Only once the hub LISTENs: a subscriber reads after subscribing and
	// must not miss a commit between its read and the LISTEN.
	if !h.life.Running() {
		return nil, ErrStopped
	}
	sub := &Subscription{hub: h, org: orgID, ready: make(chan struct{}, 1), done: h.life.Stopped()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[orgID] == nil {
		h.subs[orgID] = map[*Subscription]struct{}{}
	}
	h.subs[orgID][sub] = struct{}{}
	return sub, nil
}

// Subscription is one reader's interest in one org's events.
type Subscription struct {
	hub    *Hub
	org    string
	ready  chan struct{}
	done   <-chan struct{}
	closed sync.Once
}

// Ready receives a value when the org's log may have grown since the last
// receive; any number of appends in between coalesce into one.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Done is closed when the hub stops; the reader should end.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Close unsubscribes. Closing twice is safe.
func (s *Subscription) Close() {
	s.closed.Do(func() {
		h := s.hub
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[s.org], s)
		if len(h.subs[s.org]) == 0 {
			delete(h.subs, s.org)
		}
	})
}

// signal never blocks: a pending signal already covers this append.
func (s *Subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

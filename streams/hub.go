package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Hub fans the notifications of one LISTEN connection out to this process's
// subscribers, so that a thousand live readers cost one connection, not a
// thousand. A subscriber gets a signal, never data: it reads what is new
// from the table. Signals coalesce in a one-slot channel, so a slow reader
// holds up neither the writers nor the other readers. When the connection
// fails the hub reconnects and wakes every subscriber, since notifications
// sent meanwhile are lost; their re-read finds the chunks.
type Hub struct {
	db      *pgxpool.Pool
	logger  *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	subs    map[streamKey]map[*Subscription]struct{}
	state   hubState
	cancel  context.CancelFunc
	done    chan struct{} // closed when the listen loop has exited
	stopped chan struct{} // closed by Stop: subscriptions end
	pid     uint32        // backend pid of the LISTEN connection (tests)

	pingEvery time.Duration // idle time after which the connection is pinged
	pings     atomic.Int64  // successful pings (tests)
}

// hubPingEvery is how long the LISTEN connection may stay silent before it
// is pinged.
const hubPingEvery = 30 * time.Second

type hubState int

const (
	hubNew hubState = iota
	hubStarting
	hubRunning
	hubStopped
)

type streamKey struct{ org, run, name string }

func newHub(db *pgxpool.Pool, logger *slog.Logger, m *metrics) *Hub {
	return &Hub{db: db, logger: logger, metrics: m, subs: map[streamKey]map[*Subscription]struct{}{}, stopped: make(chan struct{}), pingEvery: hubPingEvery}
}

// Start connects and LISTENs, and returns once notifications flow; the hub
// then runs until Stop. A hub starts once.
func (h *Hub) Start(ctx context.Context) error {
	h.mu.Lock()
	if h.state != hubNew {
		h.mu.Unlock()
		return errors.New("streams hub: already started")
	}
	h.state = hubStarting
	h.mu.Unlock()

	conn, err := h.connect(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil:
		h.state = hubNew
		return err
	case h.state == hubStopped: // Stop came first
		_ = conn.Close(context.Background())
		return ErrStopped
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.state, h.cancel, h.done, h.pid = hubRunning, cancel, make(chan struct{}), conn.PgConn().PID()
	go h.run(lctx, conn)
	return nil
}

// Stop closes the LISTEN connection and ends every subscription (their
// Done channels close). Stopping twice, or a hub never started, is safe.
func (h *Hub) Stop(ctx context.Context) error {
	h.mu.Lock()
	state, cancel, done := h.state, h.cancel, h.done
	if state != hubStopped {
		h.state = hubStopped
		close(h.stopped)
	}
	h.mu.Unlock()
	if state != hubRunning {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping streams hub: %w", ctx.Err())
	}
}

// connect opens the dedicated LISTEN connection (outside the pool: it is
// held for the life of the hub).
func (h *Hub) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, h.db.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("streams hub: connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("streams hub: LISTEN: %w", err)
	}
	return conn, nil
}

func (h *Hub) run(ctx context.Context, conn *pgx.Conn) {
	defer close(h.done)
	for {
		err := h.listen(ctx, conn)
		_ = conn.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		h.logger.Warn("streams hub: LISTEN connection failed; reconnecting", "error", err.Error())
		if conn = h.reconnect(ctx); conn == nil {
			return
		}
		h.metrics.reconnects.Inc()
		h.wakeAll()
	}
}

// listen dispatches notifications until the connection fails or ctx ends.
// A connection whose peer vanished without a word would wait forever, so
// after pingEvery without a notification it is pinged.
func (h *Hub) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, h.pingEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			h.dispatch(n.Payload)
			continue
		case ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, h.pingEvery)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		h.pings.Add(1)
	}
}

// reconnect retries with capped backoff until it listens again or ctx ends
// (then nil).
func (h *Hub) reconnect(ctx context.Context) *pgx.Conn {
	backoff := 50 * time.Millisecond
	for {
		conn, err := h.connect(ctx)
		if err == nil {
			h.mu.Lock()
			h.pid = conn.PgConn().PID()
			h.mu.Unlock()
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		h.logger.Warn("streams hub: reconnect failed", "error", err.Error(), "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// dispatch signals the subscribers of the stream a payload names.
func (h *Hub) dispatch(payload string) {
	parts := strings.SplitN(payload, "/", 4)
	if len(parts) != 4 {
		h.logger.Warn("streams hub: malformed notification", "payload", payload)
		return
	}
	key := streamKey{org: parts[3], run: parts[1], name: parts[2]}
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[key] {
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

// Subscribe registers interest in the stream (org, runID, name). Subscribe
// before reading, so that nothing committed after the read is missed. The
// caller must Close the subscription.
func (h *Hub) Subscribe(org, runID, name string) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != hubRunning {
		return nil, ErrStopped
	}
	sub := &Subscription{hub: h, key: streamKey{org, runID, name}, ready: make(chan struct{}, 1)}
	if h.subs[sub.key] == nil {
		h.subs[sub.key] = map[*Subscription]struct{}{}
	}
	h.subs[sub.key][sub] = struct{}{}
	h.metrics.subscribers.Inc()
	return sub, nil
}

func (h *Hub) backendPID() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pid
}

// Subscription is one subscriber's interest in one stream.
type Subscription struct {
	hub    *Hub
	key    streamKey
	ready  chan struct{}
	closed sync.Once
}

// Ready receives a value when the stream may have changed since the last
// receive; any number of changes in between coalesce into one.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Done is closed when the hub stops; the subscriber should end.
func (s *Subscription) Done() <-chan struct{} { return s.hub.stopped }

// Close unsubscribes. Closing twice is safe.
func (s *Subscription) Close() {
	s.closed.Do(func() {
		h := s.hub
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[s.key], s)
		if len(h.subs[s.key]) == 0 {
			delete(h.subs, s.key)
		}
		h.metrics.subscribers.Dec()
	})
}

// signal never blocks: a pending signal already covers this change.
func (s *Subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

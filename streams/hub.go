package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/reveille/reveille/internal/startstop"
)

// Hub fans the notifications of one LISTEN connection out to this process's
// subscribers, so that a thousand live readers cost one connection, not a
// thousand. A notification carries no data, only the stream and its last
// index: the subscriber reads what is new from the table. Chunks appended by
// this very process are also handed to its subscribers directly (see
// Subscription), which spares them that read. Signals coalesce in a
// one-slot channel, so a slow reader holds up neither the writers nor the
// other readers. When the connection fails the hub reconnects and wakes
// every subscriber to re-read, since notifications sent meanwhile are lost.
type Hub struct {
	db      *pgxpool.Pool
	logger  *slog.Logger
	metrics *metrics

	// life runs the listen loop (internal/startstop); its Stopped channel
	// ends the subscriptions.
	life startstop.Base

	mu   sync.Mutex
	subs map[streamKey]map[*Subscription]struct{}
	pid  uint32 // backend pid of the LISTEN connection (tests)

	pingEvery   time.Duration // idle time after which the connection is pinged
	pingTimeout time.Duration // how long a ping may take
	pings       atomic.Int64  // successful pings (tests)
}

// How long the LISTEN connection may stay silent before it is pinged, and
// how long the ping may take.
const (
	hubPingEvery   = 30 * time.Second
	hubPingTimeout = 10 * time.Second
)

type streamKey struct{ org, run, name string }

func newHub(db *pgxpool.Pool, logger *slog.Logger, m *metrics) *Hub {
	return &Hub{db: db, logger: logger, metrics: m, subs: map[streamKey]map[*Subscription]struct{}{},
		pingEvery: hubPingEvery, pingTimeout: hubPingTimeout}
}

// Start connects and LISTENs, and returns once notifications flow; the hub
// then runs until Stop (or ctx ends). A hub starts once (a failed start may
// be retried).
func (h *Hub) Start(ctx context.Context) error {
	return h.life.StartWith(ctx, "streams hub", func(ctx context.Context) (func(context.Context), error) {
		conn, err := h.connect(ctx)
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		h.pid = conn.PgConn().PID()
		h.mu.Unlock()
		return func(ctx context.Context) { h.run(ctx, conn) }, nil
	})
}

// Stop closes the LISTEN connection and ends every subscription (their
// Done channels close). Stopping twice, or a hub never started, is safe.
func (h *Hub) Stop(ctx context.Context) error { return h.life.Stop(ctx) }

// connect opens the dedicated LISTEN connection (outside the pool: it is
// held for the life of the hub).
func (h *Hub) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, h.db.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("LISTEN: %w", err)
	}
	return conn, nil
}

func (h *Hub) run(ctx context.Context, conn *pgx.Conn) {
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
		pctx, cancel := context.WithTimeout(ctx, h.pingTimeout)
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

// dispatch passes a notification ("a<last index>/<run>/<name>/<org>" for
// an append, "c…" for a close) to the subscribers of its stream.
func (h *Hub) dispatch(payload string) {
	parts := strings.SplitN(payload, "/", 4)
	var idx int64
	var err error
	if len(parts) == 4 && len(parts[0]) > 1 {
		idx, err = strconv.ParseInt(parts[0][1:], 10, 64)
	}
	if len(parts) != 4 || len(parts[0]) < 2 || err != nil || (parts[0][0] != 'a' && parts[0][0] != 'c') {
		h.logger.Warn("streams hub: malformed notification", "payload", payload)
		return
	}
	key := streamKey{org: parts[3], run: parts[1], name: parts[2]}
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[key] {
		sub.note(parts[0][0] == 'c', idx)
	}
}

// publish hands chunks committed by this process, first at index first, to
// its subscribers of the stream. The data is copied once, outside the lock
// and only if anyone listens, and shared read-only; an append too large
// for an inbox only tells them to read.
func (h *Hub) publish(org, runID, name string, first int64, chunks [][]byte) {
	key := streamKey{org: org, run: runID, name: name}
	h.mu.Lock()
	listened := len(h.subs[key]) > 0
	h.mu.Unlock()
	if !listened {
		return
	}
	b := inboxBatch{first: first}
	for _, c := range chunks {
		b.size += len(c)
	}
	if b.size <= inboxMaxBytes {
		b.chunks = make([]Chunk, len(chunks))
		for i, c := range chunks {
			b.chunks[i] = Chunk{Index: first + int64(i), Data: append([]byte{}, c...)}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs[key] {
		if b.chunks == nil {
			sub.note(false, first+int64(len(chunks))-1)
		} else {
			sub.deliver(b)
		}
	}
}

func (h *Hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range h.subs {
		for sub := range subs {
			sub.markStale()
		}
	}
}

// Subscribe registers interest in the stream (org, runID, name). Subscribe
// before reading, so that nothing committed after the read is missed. The
// caller must Close the subscription.
func (h *Hub) Subscribe(org, runID, name string) (*Subscription, error) {
	// Only once the hub LISTENs: a subscriber reads after subscribing, and
	// must not miss a commit between its read and the LISTEN. A Stop after
	// this check ends the subscription through done at once.
	if !h.life.Running() {
		return nil, ErrStopped
	}
	done := h.life.Stopped()
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := &Subscription{hub: h, key: streamKey{org, runID, name}, ready: make(chan struct{}, 1), done: done, hint: -1, stale: true}
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

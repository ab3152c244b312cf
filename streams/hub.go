package streams

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/reveille/reveille/internal/listen"
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
		loop := listen.Loop{DB: h.db, Channel: notifyChannel, Name: "streams hub", Logger: h.logger,
			PingEvery: h.pingEvery, PingTimeout: h.pingTimeout, Notify: h.dispatch,
			Reconnected: func() { h.metrics.reconnects.Inc(); h.wakeAll() },
			Connected: func(conn *pgx.Conn) {
				h.mu.Lock()
				h.pid = conn.PgConn().PID()
				h.mu.Unlock()
			},
			Pinged: func() { h.pings.Add(1) }}
		conn, err := loop.Connect(ctx)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) { loop.Run(ctx, conn) }, nil
	})
}

// Stop closes the LISTEN connection and ends every subscription (their
// Done channels close). Stopping twice, or a hub never started, is safe.
func (h *Hub) Stop(ctx context.Context) error { return h.life.Stop(ctx) }

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
	h.publishOf(uuid.Nil, org, runID, name, first, chunks)
}

// publishOf is publish naming the stream row the chunks went to (uuid.Nil:
// unknown), so that a tail of a purged stream never takes the chunks of a
// new stream of the same name as its own.
func (h *Hub) publishOf(stream uuid.UUID, org, runID, name string, first int64, chunks [][]byte) {
	key := streamKey{org: org, run: runID, name: name}
	h.mu.Lock()
	listened := len(h.subs[key]) > 0
	h.mu.Unlock()
	if !listened {
		return
	}
	b := inboxBatch{first: first, stream: stream}
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

package streams

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// notifyTimeout bounds one batch of notifications.
const notifyTimeout = 10 * time.Second

// notifier sends the notifications of committed appends after their commit,
// in batches: while one batch is being sent the next accumulates, so
// concurrent appends share one notifying transaction instead of paying one
// each, and an append returns as soon as it is durable. A goroutine runs
// only while there is something to send.
type notifier struct {
	db     *pgxpool.Pool
	logger *slog.Logger

	mu      sync.Mutex
	pending []string
	// sending is closed when the sending goroutine ends; nil while none
	// runs. (A channel, not a WaitGroup: an append may start a goroutine
	// while Stop waits, which a WaitGroup forbids when its count is zero.)
	sending chan struct{}
}

// add queues a payload; it never blocks on the database.
func (n *notifier) add(payload string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending = append(n.pending, payload)
	if n.sending != nil {
		return
	}
	n.sending = make(chan struct{})
	go n.send(n.sending)
}

func (n *notifier) send(done chan struct{}) {
	for {
		n.mu.Lock()
		batch := n.pending
		n.pending = nil
		if len(batch) == 0 {
			n.sending = nil
			n.mu.Unlock()
			close(done)
			return
		}
		n.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		_, err := n.db.Exec(ctx, notifySQL, batch)
		cancel()
		if err != nil {
			// The chunks are committed; live readers elsewhere see them with
			// the stream's next notification, or when they reconnect.
			n.logger.Warn("streams: notifying appends failed", "count", len(batch), "error", err.Error())
		}
	}
}

// wait returns once nothing is being sent, or ctx ends.
func (n *notifier) wait(ctx context.Context) error {
	for {
		n.mu.Lock()
		sending := n.sending
		n.mu.Unlock()
		if sending == nil {
			return nil
		}
		select {
		case <-sending:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

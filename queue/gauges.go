package queue

import (
	"context"
	"fmt"
	"time"
)

// Outbox is the signal outbox at one moment, across every org: the
// messages not yet accepted by Temporal, split by whether a send already
// failed, and those that gave up.
type Outbox struct {
	// Pending are unsent signals no send has failed yet; Retrying those
	// whose last send failed (they are retried); Undeliverable those that
	// failed for good (until redelivered).
	Pending, Retrying, Undeliverable int64
	// OldestPending is the age of the oldest unsent signal (0: none).
	OldestPending time.Duration
}

// qOutbox reads the outbox in one statement over the open rows only
// (queue_messages_outbox_open): its cost is the number of signals not yet
// delivered, not the table's. Spans every org: it feeds the process's
// gauges.
const qOutbox = `
SELECT count(*) FILTER (WHERE status = 'pending' AND last_error IS NULL),
       count(*) FILTER (WHERE status = 'pending' AND last_error IS NOT NULL),
       count(*) FILTER (WHERE status = 'failed'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0)::float8
  FROM queue_messages
 WHERE status <> 'delivered' AND signal_workflow_id IS NOT NULL`

// ReadOutbox reads the signal outbox's state.
func ReadOutbox(ctx context.Context, q Querier) (Outbox, error) {
	var o Outbox
	var oldest float64
	if err := q.QueryRow(ctx, qOutbox).Scan(&o.Pending, &o.Retrying, &o.Undeliverable, &oldest); err != nil {
		return Outbox{}, fmt.Errorf("read the signal outbox: %w", err)
	}
	o.OldestPending = time.Duration(max(oldest, 0) * float64(time.Second))
	return o, nil
}

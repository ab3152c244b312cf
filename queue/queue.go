// Package queue is Reveille's durable, org-scoped message queue and the
// outbox for Temporal signals. A message is written in the caller's
// transaction; when it carries a signal, the Dispatcher (on every replica,
// woken by NOTIFY, claiming with SKIP LOCKED) sends it after that
// transaction commits, retrying transient failures until Temporal accepts
// it; a writer whose own process runs a dispatcher may instead hand the
// message to it after the commit (EnqueueForHandoff). Delivery is
// at-least-once: receivers dedupe.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
)

// notifyChannel wakes dispatchers when a signal becomes due.
const notifyChannel = "reveille_queue"

// Message statuses.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// ErrNotFound: no such message for this org.
var ErrNotFound = fmt.Errorf("queue message %w", apperr.ErrNotFound)

// Querier is what the queue needs from a connection: pgx.Tx and
// *pgxpool.Pool both satisfy it. (The one interface of internal/db, under
// the name callers already use.)
type Querier = db.Querier

// Signal is a Temporal signal a message carries.
type Signal struct {
	WorkflowID string
	RunID      string // optional: a specific run
	Name       string
}

// Message is a queued message.
type Message struct {
	ID             uuid.UUID
	OrgID          string
	Queue          string
	Payload        json.RawMessage
	IdempotencyKey string
	Status         string
	Signal         *Signal
	Attempts       int
	LastError      string
	NextAttemptAt  time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	DeliveredAt    *time.Time
}

// EnqueueParams describe a new message.
type EnqueueParams struct {
	OrgID          string
	Queue          string
	Payload        json.RawMessage
	IdempotencyKey string  // unique per (org, queue): a repeat returns the first message
	Signal         *Signal // when set, the payload is sent as this signal's argument
}

// Enqueue writes a message in q's transaction (idempotent on the key) and,
// when it carries a signal, wakes the dispatchers on commit. It returns the
// message and whether this call created it.
func Enqueue(ctx context.Context, q Querier, p EnqueueParams) (Message, bool, error) {
	m, created, err := insert(ctx, q, p, nil)
	if err != nil || !created || p.Signal == nil {
		return m, created, err
	}
	if _, err := q.Exec(ctx, `SELECT pg_notify($1, '')`, notifyChannel); err != nil {
		return Message{}, false, fmt.Errorf("notify dispatchers: %w", err)
	}
	return m, true, nil
}

// insert writes a message unless its key exists (then it returns that one,
// not created). A non-nil lease writes it already claimed (attempts 1)
// until lease from the moment of the insert: hidden from every
// dispatcher's claim until then.
func insert(ctx context.Context, q Querier, p EnqueueParams, lease *time.Duration) (Message, bool, error) {
	if p.OrgID == "" || p.Queue == "" || p.IdempotencyKey == "" {
		return Message{}, false, errors.New("queue: org, queue and idempotency key are required")
	}
	if p.Signal != nil && (p.Signal.WorkflowID == "" || p.Signal.Name == "") {
		return Message{}, false, errors.New("queue: a signal needs a workflow id and a name")
	}
	payload := p.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Message{}, false, err
	}
	var wf, run, name *string
	if p.Signal != nil {
		wf, name = &p.Signal.WorkflowID, &p.Signal.Name
		if p.Signal.RunID != "" {
			run = &p.Signal.RunID
		}
	}
	// The lease runs from the insert (clock_timestamp), not from the
	// transaction's start (now()): a long transaction does not eat it.
	m, err := scanMessage(q.QueryRow(ctx, `
		INSERT INTO queue_messages (id, org_id, queue, payload, idempotency_key, signal_workflow_id, signal_run_id, signal_name,
		                            attempts, next_attempt_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
		        CASE WHEN $9::interval IS NULL THEN 0 ELSE 1 END, coalesce(clock_timestamp() + $9::interval, now()))
		ON CONFLICT (org_id, queue, idempotency_key) DO NOTHING
		RETURNING `+messageColumns, id, p.OrgID, p.Queue, payload, p.IdempotencyKey, wf, run, name, lease))
	if errors.Is(err, pgx.ErrNoRows) {
		m, err = getBy(ctx, q, `org_id = $1 AND queue = $2 AND idempotency_key = $3`, p.OrgID, p.Queue, p.IdempotencyKey)
		return m, false, err
	}
	if err != nil {
		return Message{}, false, fmt.Errorf("enqueue message: %w", err)
	}
	return m, true, nil
}

// Get returns a message of the org.
func Get(ctx context.Context, q Querier, orgID string, id uuid.UUID) (Message, error) {
	return getBy(ctx, q, `org_id = $1 AND id = $2`, orgID, id)
}

// SetPayload replaces a pending message's payload.
func SetPayload(ctx context.Context, q Querier, orgID string, id uuid.UUID, payload json.RawMessage) error {
	tag, err := q.Exec(ctx, `UPDATE queue_messages SET payload = $3, updated_at = now() WHERE org_id = $1 AND id = $2 AND status = 'pending'`, orgID, id, payload)
	if err != nil {
		return fmt.Errorf("set message payload: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// Settle marks a pending message delivered or failed (with reason). A
// settled message is left alone.
func Settle(ctx context.Context, q Querier, orgID string, id uuid.UUID, status, reason string) error {
	if status != StatusDelivered && status != StatusFailed {
		return fmt.Errorf("queue: cannot settle as %q", status)
	}
	_, err := q.Exec(ctx, `
		UPDATE queue_messages SET status = $3, last_error = NULLIF($4, ''), updated_at = now(),
		       delivered_at = CASE WHEN $3 = 'delivered' THEN now() END
		 WHERE org_id = $1 AND id = $2 AND status = 'pending'`, orgID, id, status, reason)
	if err != nil {
		return fmt.Errorf("settle message: %w", err)
	}
	return nil
}

// Redeliver puts a failed signal message back in the queue with a fresh
// grace period. It reports whether the message was failed (and is now
// pending again).
func Redeliver(ctx context.Context, q Querier, orgID string, id uuid.UUID) (bool, error) {
	tag, err := q.Exec(ctx, `
		UPDATE queue_messages SET status = 'pending', next_attempt_at = now(), not_found_since = NULL, updated_at = now()
		 WHERE org_id = $1 AND id = $2 AND status = 'failed' AND signal_workflow_id IS NOT NULL`, orgID, id)
	if err != nil {
		return false, fmt.Errorf("redeliver message: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if _, err := q.Exec(ctx, `SELECT pg_notify($1, '')`, notifyChannel); err != nil {
		return false, fmt.Errorf("notify dispatchers: %w", err)
	}
	return true, nil
}

const messageColumns = `id, org_id, queue, payload, idempotency_key, status, signal_workflow_id, signal_run_id, signal_name,
	attempts, coalesce(last_error, ''), next_attempt_at, created_at, updated_at, delivered_at`

func getBy(ctx context.Context, q Querier, where string, args ...any) (Message, error) {
	m, err := scanMessage(q.QueryRow(ctx, `SELECT `+messageColumns+` FROM queue_messages WHERE `+where, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Message{}, ErrNotFound
	}
	if err != nil {
		return Message{}, fmt.Errorf("read message: %w", err)
	}
	return m, nil
}

func scanMessage(row pgx.Row) (Message, error) {
	var m Message
	var wf, run, name *string
	err := row.Scan(&m.ID, &m.OrgID, &m.Queue, &m.Payload, &m.IdempotencyKey, &m.Status, &wf, &run, &name,
		&m.Attempts, &m.LastError, &m.NextAttemptAt, &m.CreatedAt, &m.UpdatedAt, &m.DeliveredAt)
	if err != nil {
		return m, err
	}
	if wf != nil {
		m.Signal = &Signal{WorkflowID: *wf, Name: deref(name), RunID: deref(run)}
	}
	return m, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// GetByKey returns the org's message with the given queue and idempotency key.
func GetByKey(ctx context.Context, q Querier, orgID, queue, key string) (Message, error) {
	return getBy(ctx, q, `org_id = $1 AND queue = $2 AND idempotency_key = $3`, orgID, queue, key)
}

package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// Event types and kinds, as the approvals event log writes them.
const (
	TypeRequested = "requested"
	TypeResolved  = "resolved"

	KindToolCall       = "tool_call"
	KindMandateOverrun = "mandate_overrun"
)

// Headers of a delivery.
const (
	// HeaderSignature is "sha256=<hex HMAC-SHA256(secret, body)>" (json
	// format only).
	HeaderSignature = "X-Reveille-Signature"
	// HeaderEvent is approval.requested or approval.resolved.
	HeaderEvent = "X-Reveille-Event"
	// HeaderDelivery is "<org>:<seq>": the same for every attempt (and every
	// webhook) of one event, so a receiver can drop a repeat.
	HeaderDelivery = "X-Reveille-Delivery"
)

// MaxBodyBytes bounds a json delivery's body: a larger one carries the
// approval's id alone ("approval_truncated": true), and the receiver reads
// the rest from the API. (A tool call's input may be 64 KiB, which JSON
// escaping can multiply.)
const MaxBodyBytes = 256 << 10

// Event is one entry of an org's approvals event log (the fields of the
// inbox package's Event, which the service hands to Enqueue).
type Event struct {
	OrgID string
	// Seq numbers the org's events 1, 2, 3 …
	Seq int64
	// Type is TypeRequested or TypeResolved.
	Type string
	// Kind is KindToolCall or KindMandateOverrun.
	Kind       string
	ApprovalID uuid.UUID
	// Approval is the approval as its GET route shows it.
	Approval json.RawMessage
	At       time.Time
}

// Sign returns the X-Reveille-Signature value of body under secret:
// "sha256=" and the hex HMAC-SHA256 of the body's bytes, keyed with the
// secret's text.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// target is what a delivery needs of one webhook.
type target struct {
	name, url, format, secret string
	created                   time.Time
}

// Enqueue enqueues one delivery of ev to each of its org's webhooks, in q's
// transaction (db.InTx: q itself when it is a pgx.Tx, the transaction a
// connection is already in, else a transaction of its own), so the
// deliveries exist only if the event commits. Deliveries
// are counted toward the org's pending cap but never refused by it: a
// notification must not undo the approval it announces.
func (s *Store) Enqueue(ctx context.Context, q db.Querier, ev Event) error {
	if ev.Type != TypeRequested && ev.Type != TypeResolved {
		return fmt.Errorf("approval webhooks: event type %q is neither requested nor resolved", ev.Type)
	}
	return db.InTx(ctx, q, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, qTargets, ev.OrgID)
		if err != nil {
			return fmt.Errorf("reading approval webhooks: %w", err)
		}
		targets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (target, error) {
			var t target
			return t, r.Scan(&t.name, &t.url, &t.format, &t.secret, &t.created)
		})
		if err != nil {
			return fmt.Errorf("reading approval webhooks: %w", err)
		}
		if len(targets) == 0 {
			return nil
		}
		ps := make([]workpool.EnqueueParams, len(targets))
		for i, t := range targets {
			args, err := s.deliveryArgs(t, ev)
			if err != nil {
				return err
			}
			hookCtx, err := json.Marshal(deliveryContext{Name: t.name, Created: &t.created, Seq: ev.Seq, URL: t.url})
			if err != nil {
				return fmt.Errorf("approval webhook delivery: %w", err)
			}
			ps[i] = workpool.EnqueueParams{OrgID: ev.OrgID, Pool: s.cfg.Pool, Handler: httpwork.Name, Args: args,
				Retry: s.cfg.Retry, TimeoutMS: s.cfg.TimeoutMS, BypassPendingCap: true,
				OnComplete: &workpool.OnComplete{Hook: HookName, Context: hookCtx},
				// (the URL was checked when the webhook was registered; one the
				// allow-list dropped since fails its delivery, not the approval)
				SkipArgsCheck: true}
		}
		if _, err := s.pool.EnqueueManyTx(ctx, tx, ps); err != nil {
			return fmt.Errorf("enqueueing approval webhook deliveries: %w", err)
		}
		return nil
	})
}

// HookName is the onComplete hook of every delivery: it records the
// delivery's outcome on its webhook (Webhook.LastDelivery, LastFailure).
const HookName = "approval-webhook.delivered"

// deliveryContext is a delivery's hook context: which webhook, which
// event, and where it went.
type deliveryContext struct {
	Name string `json:"name"`
	// Created is the webhook's created_at: a webhook deleted and created
	// again under its name is another webhook, which must not show the
	// old one's deliveries. (nil in deliveries enqueued before it was kept)
	Created *time.Time `json:"created,omitempty"`
	Seq     int64      `json:"seq"`
	URL     string     `json:"url"`
}

// maxRecordedError bounds the error a webhook keeps of a failed delivery
// (the work item keeps it whole).
const maxRecordedError = 1000

// delivered is HookName: it records c on its webhook, in the pool's
// completion transaction, so that an admin sees a failing endpoint (and
// the work item that says why) on the webhook itself.
func (s *Store) delivered(ctx context.Context, tx pgx.Tx, c workpool.Completion) error {
	var dc deliveryContext
	if err := json.Unmarshal(c.Context, &dc); err != nil {
		return fmt.Errorf("approval webhook delivery %s: reading its hook context: %w", c.WorkID, err)
	}
	// (when the work finished, not when this call runs: a hook call that
	// failed is retried later, after newer deliveries were recorded)
	var finished *time.Time
	if err := tx.QueryRow(ctx, qWorkFinished, c.OrgID, c.WorkID).Scan(&finished); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("approval webhook delivery %s: reading when it finished: %w", c.WorkID, err)
	}
	if finished == nil {
		now := time.Now()
		finished = &now
	}
	// (jsonb holds no NUL: an error quoting a response body may)
	d := Delivery{Seq: dc.Seq, WorkID: c.WorkID, URL: dc.URL, Outcome: string(c.Outcome),
		Error:      clip(strings.ReplaceAll(c.Error, "\x00", ""), maxRecordedError),
		FinishedAt: finished.UTC()}
	if _, err := tx.Exec(ctx, qDelivered, c.OrgID, dc.Name, d, c.Outcome == workpool.OutcomeSucceeded, dc.Created, d.FinishedAt); err != nil {
		return fmt.Errorf("recording approval webhook delivery %s: %w", c.WorkID, err)
	}
	return nil
}

// clip cuts s to at most n bytes, at a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// deliveryArgs are the http handler's args of one delivery: a POST whose
// body is a JSON string, which the handler sends byte for byte, so the
// signature covers exactly what the receiver reads.
func (s *Store) deliveryArgs(t target, ev Event) (json.RawMessage, error) {
	event := "approval." + ev.Type
	headers := map[string]string{
		"Content-Type": "application/json",
		HeaderEvent:    event,
		HeaderDelivery: ev.OrgID + ":" + strconv.FormatInt(ev.Seq, 10),
		"User-Agent":   "Reveille-Webhooks/1",
	}
	var body []byte
	var err error
	if t.format == FormatSlack {
		body, err = marshal(map[string]string{"text": slackText(ev, s.cfg.PublicURL)})
	} else {
		body, err = jsonBody(ev)
		headers[HeaderSignature] = Sign(t.secret, body)
	}
	if err != nil {
		return nil, err
	}
	// (a Slack webhook's URL is its credential: kept out of the errors the
	// work, the webhook's last failure and the log show)
	args, err := marshal(httpwork.Args{URL: t.url, Method: "POST", Headers: headers, Body: mustString(body),
		SecretPath: t.format == FormatSlack, DiscardBody: true})
	if err != nil {
		return nil, fmt.Errorf("approval webhook %s: %w", t.name, err)
	}
	return args, nil
}

// jsonPayload is a json delivery's body.
type jsonPayload struct {
	Type       string          `json:"type"`
	Seq        int64           `json:"seq"`
	Kind       string          `json:"kind"`
	ApprovalID uuid.UUID       `json:"approval_id"`
	Approval   json.RawMessage `json:"approval"`
	Truncated  bool            `json:"approval_truncated,omitempty"`
	At         time.Time       `json:"at"`
}

func jsonBody(ev Event) ([]byte, error) {
	p := jsonPayload{Type: "approval." + ev.Type, Seq: ev.Seq, Kind: ev.Kind, ApprovalID: ev.ApprovalID,
		Approval: ev.Approval, At: ev.At.UTC()}
	if len(bytes.TrimSpace(p.Approval)) == 0 {
		p.Approval = json.RawMessage("null")
	}
	body, err := marshal(p)
	if err != nil || len(body) <= MaxBodyBytes {
		return body, err
	}
	p.Approval, _ = marshal(map[string]uuid.UUID{"id": ev.ApprovalID})
	p.Truncated = true
	return marshal(p)
}

// marshal is json.Marshal without HTML escaping (a receiver reads JSON,
// not HTML; escaping would only grow the body) and without the encoder's
// trailing newline.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding a webhook delivery: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// mustString is body as a JSON string (the http handler's "send as is").
func mustString(body []byte) json.RawMessage {
	s, _ := marshal(string(body)) // a string always encodes
	return s
}

// Package webhooks is approval webhooks: the URLs an org registers to hear
// of its approval events (approval.requested, approval.resolved) — signed
// JSON for programs, a one-line {text} for a Slack incoming webhook.
//
// A delivery is one work item of the pool's built-in http handler, enqueued
// in the transaction that records the event (Enqueue), so the event and its
// deliveries commit together, and the handler's retries and network rules
// (REVEILLE_HTTP_ALLOWED_HOSTS, the dial check) apply to every one. A URL
// those rules refuse whatever DNS answers is refused when it is registered.
package webhooks

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/workpool"
)

// Formats of a webhook's body.
const (
	// FormatJSON posts the event as JSON, signed in X-Reveille-Signature.
	FormatJSON = "json"
	// FormatSlack posts {"text": "<one human line>"}, for a Slack incoming
	// webhook (which takes no signature).
	FormatSlack = "slack"
)

// Limits.
const (
	// MaxPerOrg bounds an org's webhooks, and so the deliveries one event
	// enqueues.
	MaxPerOrg = 20
	// MaxURLBytes bounds a webhook's URL.
	MaxURLBytes = 2048
)

// Errors.
var (
	// ErrNotFound: no webhook of that name in the org (another org's is
	// reported the same way).
	ErrNotFound = fmt.Errorf("approval webhook %w", apperr.ErrNotFound)
	// ErrTooMany: creating one more would pass MaxPerOrg.
	ErrTooMany = fmt.Errorf("%w: an org has at most %d approval webhooks; delete one first", apperr.ErrConflict, MaxPerOrg)
)

// DefaultRetry is a delivery's retry policy unless Config says otherwise:
// ten attempts over about 40 minutes (5 s, doubling), so a receiver down
// for a while still hears of a request before the default tool-call TTL
// (1 h) runs out.
var DefaultRetry = workpool.RetryPolicy{MaxAttempts: 10, InitialBackoffMS: 5000, Base: 2}

// Config configures a Store. Zero values take the defaults noted.
type Config struct {
	// Pool is the work pool deliveries are enqueued on
	// (REVEILLE_WEBHOOK_POOL, default "default"). Its executors run the
	// http handler.
	Pool string
	// Retry is each delivery's retry policy (default DefaultRetry).
	Retry *workpool.RetryPolicy
	// TimeoutMS bounds one delivery attempt (default 30,000).
	TimeoutMS int
	// PublicURL is the engine's address as people reach it
	// (REVEILLE_PUBLIC_URL, e.g. https://reveille.example.com): Slack
	// messages link to its /inbox. Empty: they carry no link.
	PublicURL string
	// CheckURL refuses, when a webhook is put, a URL that the http
	// handler's network rules refuse whatever DNS answers
	// (httpwork.URLRules.CheckURL). Nil: only the URL's form is checked;
	// deliveries enforce the rules either way.
	CheckURL func(*url.URL) error
}

func (c Config) withDefaults() Config {
	c.Pool = cmp.Or(c.Pool, "default")
	if c.Retry == nil {
		r := DefaultRetry
		c.Retry = &r
	}
	c.TimeoutMS = cmp.Or(c.TimeoutMS, 30_000)
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	return c
}

// Webhook is a registered webhook (its secret is never read back).
type Webhook struct {
	Name      string
	URL       string
	Format    string
	CreatedAt time.Time
	UpdatedAt time.Time
	// LastDelivery is the delivery that finished last (nil: none yet);
	// LastFailure the last that did not succeed, kept after later
	// successes. Their work items are kept REVEILLE_WORK_RETENTION.
	LastDelivery, LastFailure *Delivery
}

// Delivery is a finished delivery as its webhook records it.
type Delivery struct {
	// Seq is the event's number (X-Reveille-Delivery's).
	Seq    int64     `json:"seq"`
	WorkID uuid.UUID `json:"work_id"`
	// URL is where it was sent (the webhook's URL then).
	URL string `json:"url"`
	// Outcome is succeeded, failed (its last attempt's Error) or canceled.
	Outcome    string    `json:"outcome"`
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
}

// PutParams are what a put sets.
type PutParams struct {
	URL    string
	Format string
}

// PutResult is a put's outcome: the webhook, and on creation its secret —
// the only time it is shown.
type PutResult struct {
	Webhook Webhook
	Created bool
	// Secret signs the json format's bodies; set only when Created.
	Secret string
}

// Store keeps an org's approval webhooks and enqueues their deliveries.
type Store struct {
	db   *pgxpool.Pool
	pool *workpool.Manager
	cfg  Config
}

// New returns a store whose deliveries go to pool's Config.Pool through
// its http handler (which the caller registers: httpwork.Register). It
// registers the deliveries' hook (HookName) on pool. (A nil pool serves
// the webhooks' own routes alone, as in tests of those: Enqueue needs one.)
func New(db *pgxpool.Pool, pool *workpool.Manager, cfg Config) *Store {
	s := &Store{db: db, pool: pool, cfg: cfg.withDefaults()}
	if pool != nil {
		pool.RegisterHook(HookName, s.delivered)
	}
	return s
}

// nameRE is a webhook's name: the shape of the API's other names (pools).
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

func checkName(inv *apperr.InvalidError, name string) {
	if !nameRE.MatchString(name) {
		inv.Add("name", "must be 1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit")
	}
}

// Put creates the org's webhook name, with a new secret, or replaces its
// url and format and keeps its secret.
func (s *Store) Put(ctx context.Context, orgID, name string, p PutParams) (PutResult, error) {
	inv := &apperr.InvalidError{}
	checkName(inv, name)
	s.checkURL(inv, p.URL)
	if p.Format != FormatJSON && p.Format != FormatSlack {
		inv.Add("format", `must be "json" or "slack"`)
	}
	if err := inv.OrNil(); err != nil {
		return PutResult{}, err
	}
	secret, err := newSecret()
	if err != nil {
		return PutResult{}, err
	}
	var res PutResult
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qLockOrgPuts, orgID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qLockForReplace, orgID, name); err != nil {
			return err
		}
		var err error
		res.Webhook, err = scanWebhook(tx.QueryRow(ctx, qUpsert, orgID, name, p.URL, p.Format, secret, MaxPerOrg), &res.Created)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return PutResult{}, ErrTooMany
	}
	if err != nil {
		return PutResult{}, fmt.Errorf("putting approval webhook: %w", err)
	}
	if res.Created {
		res.Secret = secret
	}
	return res, nil
}

// checkURL adds a field error unless raw is an absolute http(s) URL the
// network rules allow.
func (s *Store) checkURL(inv *apperr.InvalidError, raw string) {
	switch {
	case raw == "":
		inv.Add("url", "is required: the http(s) URL events are posted to")
		return
	case len(raw) > MaxURLBytes:
		inv.Add("url", fmt.Sprintf("must be at most %d bytes", MaxURLBytes))
		return
	case !utf8.ValidString(raw) || strings.ContainsFunc(raw, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		inv.Add("url", "must not hold spaces or control characters")
		return
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		inv.Add("url", "must be an absolute http or https URL")
		return
	}
	if s.cfg.CheckURL != nil {
		if err := s.cfg.CheckURL(u); err != nil {
			inv.Add("url", "refused by the network rules of the http handler: "+strings.TrimPrefix(err.Error(), "http: "))
		}
	}
}

// Get returns the org's webhook name.
func (s *Store) Get(ctx context.Context, orgID, name string) (Webhook, error) {
	inv := &apperr.InvalidError{}
	checkName(inv, name)
	if inv.OrNil() != nil {
		return Webhook{}, ErrNotFound // no webhook can have that name
	}
	w, err := scanWebhook(s.db.QueryRow(ctx, qGet, orgID, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("reading approval webhook: %w", err)
	}
	return w, nil
}

// List returns the org's webhooks by name (at most MaxPerOrg, give or
// take a race).
func (s *Store) List(ctx context.Context, orgID string) ([]Webhook, error) {
	rows, err := s.db.Query(ctx, qList, orgID)
	if err != nil {
		return nil, fmt.Errorf("listing approval webhooks: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Webhook, error) { return scanWebhook(r) })
	if err != nil {
		return nil, fmt.Errorf("listing approval webhooks: %w", err)
	}
	return items, nil
}

// Delete removes the org's webhook name. Deliveries already enqueued still
// run.
func (s *Store) Delete(ctx context.Context, orgID, name string) error {
	tag, err := s.db.Exec(ctx, qDelete, orgID, name)
	if err != nil {
		return fmt.Errorf("deleting approval webhook: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// scanWebhook scans webhookColumns, then into more.
func scanWebhook(row pgx.Row, more ...any) (Webhook, error) {
	var w Webhook
	err := row.Scan(append([]any{&w.Name, &w.URL, &w.Format, &w.CreatedAt, &w.UpdatedAt, &w.LastDelivery, &w.LastFailure}, more...)...)
	return w, err
}

// newSecret is 32 random bytes in hex: the HMAC key is this text.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	return "whsec_" + hex.EncodeToString(b), nil
}

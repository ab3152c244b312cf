package client

import (
	"context"
	"net/http"
	"time"
)

// ApprovalWebhooksService calls the approval webhook routes
// (/v1/approvals/webhooks): where an org's approval events are posted.
type ApprovalWebhooksService struct{ c *Client }

// ApprovalWebhook is a registered approval webhook.
type ApprovalWebhook struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// Format is json (signed) or slack ({"text": …}).
	Format    string    `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// LastDelivery is the delivery that finished last, LastFailure the
	// last that did not succeed (kept after later successes); nil until
	// one has.
	LastDelivery *WebhookDelivery `json:"last_delivery"`
	LastFailure  *WebhookDelivery `json:"last_failure"`
	// Secret is set only in the answer to the Put that created the
	// webhook: the key of its X-Reveille-Signature HMACs. Keep it.
	Secret string `json:"secret,omitempty"`
}

// WebhookDelivery is a finished delivery of an approval webhook.
type WebhookDelivery struct {
	// Seq is the event's number, as in X-Reveille-Delivery.
	Seq int64 `json:"seq"`
	// WorkID is the delivery's work item (Work.Get: its attempts), kept
	// REVEILLE_WORK_RETENTION.
	WorkID string `json:"work_id"`
	// URL is where it was sent.
	URL string `json:"url"`
	// Outcome is succeeded, failed or canceled.
	Outcome string `json:"outcome"`
	// Error is why it failed (its last attempt's error, at most 1,000
	// bytes).
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
}

// ApprovalWebhookRequest is the body of PUT /v1/approvals/webhooks/{name}.
type ApprovalWebhookRequest struct {
	// URL is an absolute http(s) URL the engine's REVEILLE_HTTP_ALLOWED_HOSTS
	// admits.
	URL string `json:"url"`
	// Format is json or slack.
	Format string `json:"format"`
}

type approvalWebhookList struct {
	Items []ApprovalWebhook `json:"items"`
}

// Put creates the webhook (its answer carries the secret, once) or
// replaces its url and format (the secret is kept). It is retried under an
// Idempotency-Key, so a lost answer to a create is answered again with its
// secret.
func (s *ApprovalWebhooksService) Put(ctx context.Context, name string, req ApprovalWebhookRequest, opts ...CallOption) (ApprovalWebhook, error) {
	ep := endpoint{method: http.MethodPut, path: pathOf("v1", "approvals", "webhooks", name), safety: keyed, argErr: needArgs("ApprovalWebhooks.Put", "name", name)}
	return doJSON[ApprovalWebhook](ctx, s.c, ep, req, opts)
}

// Get returns one webhook (without its secret).
func (s *ApprovalWebhooksService) Get(ctx context.Context, name string, opts ...CallOption) (ApprovalWebhook, error) {
	return doJSON[ApprovalWebhook](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "approvals", "webhooks", name), argErr: needArgs("ApprovalWebhooks.Get", "name", name)}, nil, opts)
}

// List returns the org's webhooks by name (at most 20: one call).
func (s *ApprovalWebhooksService) List(ctx context.Context, opts ...CallOption) ([]ApprovalWebhook, error) {
	out, err := doJSON[approvalWebhookList](ctx, s.c, endpoint{method: http.MethodGet, path: pathOf("v1", "approvals", "webhooks")}, nil, opts)
	return out.Items, err
}

// Delete removes a webhook; deliveries already enqueued still run. A 404
// is an error (IsNotFound) — but not to a retry after an attempt that got
// no answer at all (or a success cut short): that attempt deleted the
// webhook, and Delete returns
// nil. (After a 5xx, or an error answer cut inside its body, the 404
// stays an error, a *MaybeAppliedError: the status line may come from a
// proxy that forwarded nothing.)
func (s *ApprovalWebhooksService) Delete(ctx context.Context, name string, opts ...CallOption) error {
	ep := endpoint{method: http.MethodDelete, path: pathOf("v1", "approvals", "webhooks", name), argErr: needArgs("ApprovalWebhooks.Delete", "name", name),
		goneIsDone: true}
	return doNoContent(ctx, s.c, ep, nil, opts)
}

package api

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/webhooks"
)

// webhookRoutes serves the approval webhooks (issue 14): an org's admin
// registers where its approval events are posted. They are the org's, so
// a token bound to an agent may not touch them.
func (s *Server) webhookRoutes() {
	if s.svc.Webhooks == nil {
		return
	}
	admin := []string{RoleAdmin}
	orgWide := refuseBoundTokens("approval webhooks are the org's, not an agent's")
	// A create's answer is the only one with the secret: a retry under an
	// Idempotency-Key gets that answer again rather than a secretless 200.
	s.route(http.MethodPut, "/v1/approvals/webhooks/:name", s.putWebhook, admin, orgWide, s.idempotent())
	s.route(http.MethodGet, "/v1/approvals/webhooks", s.listWebhooks, admin, orgWide)
	s.route(http.MethodGet, "/v1/approvals/webhooks/:name", s.getWebhook, admin, orgWide)
	s.route(http.MethodDelete, "/v1/approvals/webhooks/:name", s.deleteWebhook, admin, orgWide)
}

type webhookJSON struct {
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Format    string    `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// LastDelivery and LastFailure are null until a delivery finished
	// (failed).
	LastDelivery *webhooks.Delivery `json:"last_delivery"`
	LastFailure  *webhooks.Delivery `json:"last_failure"`
	// Secret is set only in a create's answer.
	Secret string `json:"secret,omitempty"`
}

func webhookOut(w webhooks.Webhook) webhookJSON {
	return webhookJSON{Name: w.Name, URL: w.URL, Format: w.Format, CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC(),
		LastDelivery: utcDelivery(w.LastDelivery), LastFailure: utcDelivery(w.LastFailure)}
}

func utcDelivery(d *webhooks.Delivery) *webhooks.Delivery {
	if d == nil {
		return nil
	}
	out := *d
	out.FinishedAt = out.FinishedAt.UTC()
	return &out
}

type webhookIn struct {
	URL    string `json:"url" required:"true"`
	Format string `json:"format" required:"true"`
}

// decodeWebhook decodes PUT /v1/approvals/webhooks/{name}; the store
// validates the fields.
func decodeWebhook(body []byte) (webhooks.PutParams, error) {
	var in webhookIn
	if err := decodeJSON(body, &in); err != nil {
		return webhooks.PutParams{}, err
	}
	return webhooks.PutParams{URL: in.URL, Format: in.Format}, nil
}

func (s *Server) putWebhook(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return err
	}
	params, err := bindBody(c, decodeWebhook)
	if err != nil {
		return err
	}
	res, err := s.svc.Webhooks.Put(c.Request().Context(), PrincipalFrom(c).OrgID, name, params)
	if err != nil {
		return err
	}
	out := webhookOut(res.Webhook)
	if !res.Created {
		return c.JSON(http.StatusOK, out)
	}
	out.Secret = res.Secret
	return c.JSON(http.StatusCreated, out)
}

func (s *Server) listWebhooks(c echo.Context) error {
	items, err := s.svc.Webhooks.List(c.Request().Context(), PrincipalFrom(c).OrgID)
	if err != nil {
		return err
	}
	// (an org has at most webhooks.MaxPerOrg, read whole and paged here,
	// in the shape of every list: at the default limit, one page)
	items, next, err := namePage(c, items, func(w webhooks.Webhook) string { return w.Name })
	if err != nil {
		return err
	}
	out := struct {
		Items      []webhookJSON `json:"items"`
		NextCursor *string       `json:"next_cursor"`
	}{Items: make([]webhookJSON, 0, len(items)), NextCursor: next}
	for _, w := range items {
		out.Items = append(out.Items, webhookOut(w))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getWebhook(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return err
	}
	w, err := s.svc.Webhooks.Get(c.Request().Context(), PrincipalFrom(c).OrgID, name)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, webhookOut(w))
}

func (s *Server) deleteWebhook(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return err
	}
	if err := s.svc.Webhooks.Delete(c.Request().Context(), PrincipalFrom(c).OrgID, name); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

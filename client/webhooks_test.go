package client_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/webhooks"
)

// allowLocalHTTP lets the engine's http handler (and so webhooks) reach
// this machine's test servers.
func allowLocalHTTP(c *service.Config) { c.HTTPWork.AllowedHosts = []string{"127.0.0.1:*"} }

// The whole round trip through the service's wiring: a webhook put over
// REST gets an approvals event — handed to the store as the event log
// hands it — through the configured pool's http handler, signed with the
// secret the create showed.
func TestAWebhookPutOverRESTReceivesTheOrgsEventsThroughTheService(t *testing.T) {
	e := startEngine(t, allowLocalHTTP)
	ctx := context.Background()
	type delivery struct {
		header http.Header
		body   []byte
	}
	got := make(chan delivery, 10)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- delivery{r.Header.Clone(), body}
	}))
	t.Cleanup(rcv.Close)

	asAdmin := newClient(t, e.url, admin, nil)
	hook, err := asAdmin.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: rcv.URL + "/hook", Format: "json"})
	require.NoError(t, err)
	_, err = asAdmin.ApprovalWebhooks.Put(ctx, "ops", client.ApprovalWebhookRequest{URL: "http://10.0.0.5/hook", Format: "json"})
	require.True(t, client.IsInvalid(err), "a private address the allow-list lacks: %v", err)

	ev := webhooks.Event{OrgID: orgA, Seq: 1, Type: webhooks.TypeRequested, Kind: webhooks.KindToolCall,
		ApprovalID: uuid.Must(uuid.NewV7()), Approval: json.RawMessage(`{"agent_id":"a1","tool_name":"shell"}`), At: time.Now()}
	require.NoError(t, e.svc.Webhooks().Enqueue(ctx, e.svc.DB(), ev))
	other := ev
	other.OrgID = orgB
	require.NoError(t, e.svc.Webhooks().Enqueue(ctx, e.svc.DB(), other))

	select {
	case d := <-got:
		mac := hmac.New(sha256.New, []byte(hook.Secret))
		mac.Write(d.body)
		require.Equal(t, "sha256="+hex.EncodeToString(mac.Sum(nil)), d.header.Get("X-Reveille-Signature"))
		require.Equal(t, "org-a:1", d.header.Get("X-Reveille-Delivery"), "org A's event, not org B's")
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery")
	}
}

package client_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
)

// allowLocalHTTP lets the engine's http handler (and so webhooks) reach
// this machine's test servers.
func allowLocalHTTP(c *service.Config) { c.HTTPWork.AllowedHosts = []string{"127.0.0.1:*"} }

// The whole round trip through the service's wiring: a webhook put over
// REST gets the approvals event of a tool call made over REST — enqueued
// by the event log's OnAppend in the call's transaction — through the
// configured pool's http handler, signed with the secret the create showed.
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

	// A tool call going pending in each org: org A's event reaches org A's
	// hook through the event log's transaction; org B has no hook.
	otherAgent := who{org: orgB, sub: "runtime-b", roles: []string{api.RoleAgent}}
	for _, w := range []who{otherAgent, agent} {
		ans, err := newClient(t, e.url, w, nil).ToolApprovals.Request(ctx, "s1", client.ToolCallRequest{AgentID: "a1", ToolName: "shell"})
		require.NoError(t, err)
		require.Equal(t, "pending", ans.Decision)
	}

	select {
	case d := <-got:
		mac := hmac.New(sha256.New, []byte(hook.Secret))
		mac.Write(d.body)
		require.Equal(t, "sha256="+hex.EncodeToString(mac.Sum(nil)), d.header.Get("X-Reveille-Signature"))
		require.Equal(t, orgA+":1", d.header.Get("X-Reveille-Delivery"), "org A's event, not org B's")
		require.Equal(t, "approval.requested", d.header.Get("X-Reveille-Event"))
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery")
	}
}

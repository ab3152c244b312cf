package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// Something in front of the API (a misrouted ingress, a maintenance
// responder) answers 204 No Content. The API answers 204 only to calls
// that return nothing (Streams.Close, the deletes); to a create, a spend or
// a get, a 204 is not the API's answer, exactly as an empty 200 is not (the
// client refuses that one: "a zero value would pass for one"). Passed off
// as a success, a create "succeeds" with an empty id and nothing was made.
func TestA204ToACallThatReturnsAnObjectIsNotASuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, client.WithToken("t"))
	require.NoError(t, err)
	ctx := context.Background()

	// An empty 200 is refused: the client's own rule.
	empty200 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer empty200.Close()
	c200, err := client.New(empty200.URL, client.WithToken("t"))
	require.NoError(t, err)
	_, err = c200.Mandates.Create(ctx, client.MandateCreate{AgentID: "a", Scope: "s", Budget: 1})
	require.Error(t, err, "an empty 200 is not a mandate")

	// The same call answered 204 must not pass for a created mandate either.
	m, err := c.Mandates.Create(ctx, client.MandateCreate{AgentID: "a", Scope: "s", Budget: 1})
	require.Error(t, err, "a 204 passed for a created mandate: %+v", m)
	w, err := c.Wakeups.Create(ctx, client.WakeupRequest{AgentID: "a", WorkflowID: "o/wf", Signal: "s", Scope: "s", Cost: 1,
		Work: client.WakeupWork{Handler: "echo"}})
	require.Error(t, err, "a 204 passed for a created wake-up: %+v", w)
	res, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
	require.Error(t, err, "a 204 passed for an allowed spend: %+v", res)

	// A call that returns nothing still takes its 204.
	require.NoError(t, c.Streams.Close(ctx, "run", "out"))
}

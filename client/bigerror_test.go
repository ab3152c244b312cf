package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// A problem past 64 KiB (a detail echoing much of a request) keeps its
// type and its fields: the client kept only the first 64 KiB of an error
// answer, which then no longer parsed, and errors.As gave a problem without
// a type and with no field. Found by review.
func TestALongProblemKeepsItsTypeAndFields(t *testing.T) {
	long := strings.Repeat("k", 200_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "https://reveille.dev/problems/invalid-request", "title": "Bad Request",
			"status": 400, "detail": "invalid work.args." + long + ": unknown field",
			"errors": []map[string]string{{"field": "work.args." + long, "detail": "unknown field"}}})
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, client.WithToken("t"))
	require.NoError(t, err)
	_, err = c.Mandates.Create(context.Background(), client.MandateCreate{AgentID: "a", Scope: "s", Budget: 1})
	var apiErr *client.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, http.StatusBadRequest, apiErr.Status)
	require.Equal(t, "invalid-request", apiErr.Kind())
	require.Len(t, apiErr.Errors, 1)
	require.Equal(t, "work.args."+long, apiErr.Errors[0].Field)
}

package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A standing policy can be deleted by its match as GET lists it (the only
// spelling of it the API gives back). The delete bounds the match's
// spelling to 4 KiB, but the list spells a match otherwise — numbers in
// plain notation, as jsonb prints them, and &, <, > escaped, as the JSON
// encoder writes them — so a 3 KiB shell command holding "&&", or a match
// holding 1e5000, could be put and listed but never deleted
// (400 "must be at most 4096 bytes"), and the cap's "delete one first"
// could not be followed.
func TestAPolicyCanBeDeletedByItsMatchAsListed(t *testing.T) {
	for _, tc := range []struct {
		name, match string
		mayRefuse   bool // (a put may refuse it, naming match, rather than list it longer than it may be deleted by)
	}{
		// (the list escapes &, < and > as \u0026, \u003c, \u003e: 6 bytes each)
		{"a shell command of 3 KiB", `{"cmd":"` + strings.Repeat("make && ", 384) + `"}`, false},
		{"a match holding 1e5000", `{"n":1e5000}`, true},
	} {
		match := tc.match
		t.Run(tc.name, func(t *testing.T) {
			f := newApprovalsFixture(t)
			require.LessOrEqual(t, len(match), 4096)
			r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.admin,
				`{"approval":"never","match":`+match+`}`)
			if tc.mayRefuse && r.Status == http.StatusBadRequest {
				require.Equal(t, "match", r.requireProblem(t, http.StatusBadRequest)["errors"].([]any)[0].(map[string]any)["field"])
				return
			}
			require.Equal(t, http.StatusOK, r.Status, "body: %.300s", r.Body)

			r = do(t, f.h, http.MethodGet, "/v1/agents/agent-1/tool-policies", f.admin, nil)
			require.Equal(t, http.StatusOK, r.Status)
			var list struct {
				Items []struct {
					Match json.RawMessage `json:"match"`
				} `json:"items"`
			}
			require.NoError(t, json.Unmarshal(r.Body, &list))
			require.Len(t, list.Items, 1)
			listed := string(list.Items[0].Match)

			r = do(t, f.h, http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell?match="+url.QueryEscape(listed), f.admin, nil)
			require.Equal(t, http.StatusNoContent, r.Status, "put as %d bytes, listed as %d: %.300s", len(match), len(listed), r.Body)
		})
	}
}

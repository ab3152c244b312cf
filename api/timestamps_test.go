package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Timestamps that are not RFC 3339 (the document's date-time): a comma
// before the fraction, an offset of 24 hours or of 60 minutes. Each is a
// 400 naming the field — not stored as some instant the client did not
// write (+05:60 read as +06:00, +24:00 as a day back).
var notRFC3339 = []string{
	"2030-01-01T00:00:00,5Z",
	"2030-01-01T00:00:00+05:60",
	"2030-01-01T00:00:00+24:00",
}

func TestWorkRunAtThatIsNotRFC3339IsRefusedNamingIt(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", "admin")
	for _, at := range notRFC3339 {
		r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, map[string]any{"handler": "block", "run_at": at})
		require.Equal(t, http.StatusBadRequest, r.Status, "run_at %s: %s", at, r.Body)
		require.Contains(t, string(r.Body), `"field":"run_at"`)
	}
}

func TestMandateValidUntilThatIsNotRFC3339IsRefusedNamingIt(t *testing.T) {
	s := newTestServer(t, withMandates(t))
	admin := token(t, "org-a", "admin")
	for i, at := range notRFC3339 {
		r := do(t, s.Handler(), http.MethodPost, "/v1/mandates", admin,
			map[string]any{"agent_id": "a1", "scope": "s" + string(rune('a'+i)), "budget": 1, "valid_until": at})
		require.Equal(t, http.StatusBadRequest, r.Status, "valid_until %s: %s", at, r.Body)
		require.Contains(t, string(r.Body), `"field":"valid_until"`)
	}
}

package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A body whose numbers grow it by more than 64 KiB as jsonb prints them is
// a 400 naming body (docs/security.md) — whatever white space it carries:
// jsonb keeps none of it, so spaces sent are not room for digits given
// back. 7 × 1e131071 in args grow the body by 917 KB as printed; 900 KB of
// trailing spaces must not make that pass.
func TestNumberGrowthIsNotOffsetByWhiteSpace(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", RoleAdmin)
	body := `{"handler": "echo", "args": {"x": [` + strings.Repeat("1e131071,", 6) + `1e131071]}}` + strings.Repeat(" ", 900<<10)
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body)
	var printed int
	_ = s.svc.DB.QueryRow(context.Background(), `SELECT coalesce(max(length(args::text)), 0) FROM workpool_work`).Scan(&printed)
	require.Equal(t, http.StatusBadRequest, r.Status, "accepted: args of %d JSON bytes sent are given back as %d", len(`{"x":[`+strings.Repeat("1e131071,", 6)+`1e131071]}`), printed)
	r.requireProblem(t, http.StatusBadRequest, "body")
}

// A zero is printed "0" whatever its exponent: 0e70000 (7 bytes) is
// storable and given back as 1 byte, not 70,000 digits.
func TestAZeroWithAnExponentIsNotCountedAsItsDigits(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := token(t, "org-a", RoleAdmin)
	r := do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, `{"handler": "echo", "args": {"x": 0e70000}}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	var printed string
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT args::text FROM workpool_work`).Scan(&printed))
	require.Equal(t, `{"x": 0}`, printed)
}

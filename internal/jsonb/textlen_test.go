package jsonb

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// TextLen is what jsonb prints, less its spaces after ':' and ',' — for
// numbers exactly (plain notation), for strings at most (as sent) — so a
// bound on it bounds what the database gives back.
func TestTextLenBoundsWhatJSONBPrints(t *testing.T) {
	db := testkit.NewPool(t)
	exact := []string{
		`1e131071`, `-1E+5`, `1e-16383`, `1.5e-20`, `6.02e23`, `1e308`, `5e-324`, `0.000123e10`, `120e3`, `0.10`, `1.0`,
		`12345678901234567890`, `-0.5`, `0`, `[1,2,3]`, `{"a":[1e40,{"b":-2.5e-3}],"c":null,"d":true}`,
		`{"x":[` + strings.Repeat("1e1000,", 9) + `1e1000]}`,
	}
	atMost := []string{`"caf\u00e9 \/ \" \\ \n"`, `{"k\u0041":"v"}`, `-0`, `0e5`, `-0.0e-3`}
	printed := func(c string) int {
		var n int
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT length(replace(replace($1::text::jsonb::text, ': ', ':'), ', ', ','))`, c).Scan(&n))
		return n
	}
	for _, c := range exact {
		require.Equal(t, printed(c), TextLen([]byte(c)), "%.60s", c)
	}
	for _, c := range atMost {
		require.GreaterOrEqual(t, TextLen([]byte(c)), printed(c), "%.60s", c)
	}
}

package jsonb

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// TextLen is what jsonb prints — numbers in plain notation and the spaces
// after ',' and ':' exactly, strings at most (as sent) — so a bound on it
// bounds what the database gives back; never less, whatever the spelling.
func TestTextLenBoundsWhatJSONBPrints(t *testing.T) {
	db := testkit.NewPool(t)
	exact := []string{
		`1e131071`, `-1E+5`, `1e-16383`, `1.5e-20`, `6.02e23`, `1e308`, `5e-324`, `0.000123e10`, `120e3`, `0.10`, `1.0`,
		`12345678901234567890`, `-0.5`, `0`, `[1,2,3]`, `{"a":[1e40,{"b":-2.5e-3}],"c":null,"d":true}`,
		`{"x":[` + strings.Repeat("1e1000,", 9) + `1e1000]}`, `[0,0,0]`, `{"a" : 1 , "b":[ ]}`,
		`0e5`, `0e1000000000`, `0.000e5`, `0e-5`, `0.0e-3`, `1.000e3`, `123.456e-2`, `0.00120`, `1E+2`, `1e00005`,
	}
	atMost := []string{`"caf\u00e9 \/ \" \\ \n"`, `{"k\u0041":"v"}`, `-0`, `-0.0e-3`}
	printed := func(c string) int {
		var n int
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT length($1::text::jsonb::text)`, c).Scan(&n))
		return n
	}
	for _, c := range exact {
		require.Equal(t, printed(c), TextLen([]byte(c)), "%.60s", c)
	}
	for _, c := range atMost {
		require.GreaterOrEqual(t, TextLen([]byte(c)), printed(c), "%.60s", c)
	}
}

// NumberGrowth is how much longer the numbers print than they are written,
// strings and white space aside.
func TestNumberGrowthCountsOnlyWhatNumbersAddPrinted(t *testing.T) {
	for _, tc := range []struct {
		json string
		want int
	}{
		{`[1, 2.5, -3, 0.10]`, 0},
		{`[0, 0, 0]` + strings.Repeat(" ", 100), 0},
		{`{"1e5000": "1e5000"}`, 0},
		{`1e5000`, 5001 - 6},
		{`[1e3, 0e99999, 2E+2]`, 1}, // (1000 is a byte more; 0 and 200 are shorter)
	} {
		require.Equal(t, tc.want, NumberGrowth([]byte(tc.json)), tc.json)
	}
}

package jsonb

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// Storable says yes exactly when Postgres jsonb accepts the JSON, at
// the edges of each rule.
func TestStorableJSONAgreesWithPostgres(t *testing.T) {
	db := testkit.NewPool(t)
	digits := func(n int) string { return strings.Repeat("7", n) }
	cases := []string{
		`{"a": [null, true, false, 1, -2.5, 0e0, -0.0, "text é \u00e9 \ud83d\ude00"]}`,
		`"\u0000"`, `"a\u0000b"`, `{"\u0000": 1}`, `"\\u0000"`, `"\u0001"`,
		"\"caf\xe9\"", "{\"k\xff\": 1}", // (bytes that are not UTF-8: json.Valid takes them)
		`"\ud800"`, `"\udc00"`, `"\ude00\ud83d"`, `"\ud83d\u0041"`, `"\ud83dx"`, `"\ud83d\\ude00"`, `"\ud83d"`,
		`1e131071`, `1e131072`, `-1E+131071`, `1e-16383`, `1e-16384`, `0.0e-16382`, `0.0e-16383`, `1.5e-16382`, `1.5e-16383`,
		`0e200000`, `0e1073741822`, `0e1073741823`, `1e99999999999999999999`, `0e-0000016383`, `0e-16384`,
		`0.000123e131075`, `0.000123e131076`, `120e131070`, `120e131071`,
		`0.` + digits(16383), `0.` + digits(16384), `1.` + digits(16000) + `e-383`, `1.` + digits(16000) + `e-384`,
		digits(131072), digits(131073), digits(130072) + `e1000`, digits(130073) + `e1000`, `0.` + digits(10) + `e131072`, `0.` + digits(10) + `e131073`,
	}
	for _, c := range cases {
		require.True(t, json.Valid([]byte(c)), "%.40s is JSON", c)
		_, pgErr := db.Exec(context.Background(), `SELECT $1::text::jsonb`, c)
		require.Equal(t, pgErr == nil, Storable([]byte(c)), "%.60s…: Postgres says %v", c, pgErr)
	}
}

// Text leaves what Postgres text stores alone and replaces what it refuses
// (NUL, bytes that are not UTF-8), and Postgres stores every result.
func TestTextIsStorableAsPostgresText(t *testing.T) {
	db := testkit.NewPool(t)
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "plain é 😀", "plain é 😀"},
		{"empty", "", ""},
		{"NUL", "a\x00b", "a\uFFFDb"},
		{"byte that is not UTF-8", "a\xffb", "a\uFFFDb"},
		{"rune cut in half", "cut \xe2\x82", "cut \uFFFD"},
		{"NUL and a bad byte", "a\x00b\xffc", "a\uFFFDb\uFFFDc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Text(tc.in)
			require.Equal(t, tc.want, got)
			var stored string
			require.NoError(t, db.QueryRow(context.Background(), `SELECT $1::text`, got).Scan(&stored))
			require.Equal(t, got, stored)
		})
	}
}

func TestNestingCountsArraysAndObjectsNotWhatStringsHold(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`1`, 0},
		{`"[[["`, 0},
		{`[]`, 1},
		{`{"a":[{"b":[]}]}`, 4},
		{`[[1],[[2]]]`, 3},
		{`["\"[[", {"k\\": [1]}]`, 3},
		{`{"a":"]]]","b":[[]]}`, 3},
	} {
		require.Equal(t, tc.want, Nesting([]byte(tc.in)), tc.in)
	}
}

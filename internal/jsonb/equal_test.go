package jsonb

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEqualComparesValuesAsJSONBDoes(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		equal bool
	}{
		{`{"a":1,"b":[true,null,"x"]}`, `{"b": [true, null, "x"], "a": 1}`, true},
		{`1`, `1.0`, true},
		{`100`, `1e2`, true},
		{`0.01`, `1E-2`, true},
		{`-0`, `0.0`, true},
		{`-1`, `1`, false},
		{`9007199254740993`, `9007199254740992`, false}, // one value as float64
		{`12345678901234567890123456789`, `12345678901234567890123456788`, false},
		{`{"n":0.1}`, `{"n":0.10}`, true},
		{`{"a":1}`, `{"a":1,"b":2}`, false},
		{`[1,2]`, `[2,1]`, false},
		{`"1"`, `1`, false},
		{``, `null`, true},
		{`null`, `{}`, false},
		{`{`, `{`, false},
		{`1 2`, `1 2`, false},
		{`{"a":1} x`, `{"a":1} x`, false},
		{`{"a":1}` + "\n", `{"a":1}`, true},
	} {
		require.Equal(t, tc.equal, Equal([]byte(tc.a), []byte(tc.b)), "%s vs %s", tc.a, tc.b)
		require.Equal(t, tc.equal, Equal([]byte(tc.b), []byte(tc.a)), "%s vs %s", tc.b, tc.a)
	}
}

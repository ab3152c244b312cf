package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTheUnstorableValueIsNamedByItsPath(t *testing.T) {
	cases := []struct{ body, field string }{
		{`{"a": {"b": [1, "\u0000"]}}`, "a.b[1]"},
		{`{"a": 1, "b\u0000c": 2}`, "b\x00c"},
		{`{"a": [{"x": 1}, {"y": [1e200000]}]}`, "a[1].y[0]"},
		{`{"chunks": [{"data_base64": ""}, {"data_base64": "\udc00"}]}`, "chunks[1].data_base64"},
		{`"\u0000"`, "body"},
		{`[[], [0.` + strings.Repeat("1", 16384) + `]]`, "[1][0]"},
	}
	for _, tc := range cases {
		field, _, found := unstorableJSON([]byte(tc.body))
		require.True(t, found, tc.body)
		require.Equal(t, tc.field, field, tc.body)
	}
	_, _, found := unstorableJSON([]byte(`{"a": ["\ud83d\ude00", 1e1000, "\\u0000"]}`))
	require.False(t, found)
}

package client_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's client example is spend's body in example_test.go, word
// for word: compiled with the tests, it cannot rot.
func TestTheREADMEsExampleIsCompiledHere(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Go client\n")
	require.True(t, ok, "the README's Go client section")
	_, block, ok := strings.Cut(section, "```go\n")
	require.True(t, ok, "its example")
	block, _, ok = strings.Cut(block, "```\n")
	require.True(t, ok)
	require.LessOrEqual(t, strings.Count(block, "\n"), 12, "a short example (the issue: ten lines)")

	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, body, ok := strings.Cut(string(src), "\nfunc spend(ctx context.Context, token string) error {\n")
	require.True(t, ok)
	body, _, ok = strings.Cut(body, "\treturn nil\n}\n")
	require.True(t, ok)
	var want strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	require.Equal(t, want.String(), block)
}
